#include "bench/proc_stats.h"

#include <sys/resource.h>

#include <fstream>
#include <string>

namespace kvferry::bench {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

FaultSample read_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {static_cast<uint64_t>(u.ru_minflt), static_cast<uint64_t>(u.ru_majflt)};
}

RssSample read_rss() {
  RssSample r;
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    uint64_t* dst = key == "VmRSS:" ? &r.rss_kib : key == "RssAnon:" ? &r.anon_kib : key == "RssShmem:" ? &r.shmem_kib : nullptr;
    if (dst) f >> *dst;
    std::string rest;
    std::getline(f, rest);
  }
  return r;
}

}  // namespace kvferry::bench
