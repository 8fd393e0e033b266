// This process's CPU time, resident memory and page faults, for the benchmarks.
// cpu_seconds(): getrusage(RUSAGE_SELF) user + system over all threads, seconds.
// read_rss(): /proc/self/status VmRSS, RssAnon, RssShmem in KiB. KV pools are SysV shared memory
// (RssShmem), so RssAnon is the rank's own memory, pools aside.
// Thread contract: any thread.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

namespace kvferry::bench {

struct RssSample {
  uint64_t rss_kib = 0;
  uint64_t anon_kib = 0;
  uint64_t shmem_kib = 0;
  nlohmann::json to_json() const { return {{"rss_kib", rss_kib}, {"anon_kib", anon_kib}, {"shmem_kib", shmem_kib}}; }
};

// Page faults of this process so far (getrusage RUSAGE_SELF ru_minflt / ru_majflt, all threads).
struct FaultSample {
  uint64_t minor = 0;
  uint64_t major = 0;
};

double cpu_seconds();
RssSample read_rss();
FaultSample read_faults();

}  // namespace kvferry::bench
