// What every `kvferry bench-rank` loop shares (bench_rank.cc): the ready/go files, the room
// samples and the rank's measurements (CPU, RSS, page faults, transport writes) over the window.
// Thread contract: the rank's main thread only.
#pragma once
#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/proc_stats.h"
#include "kvferry/log.h"
#include "endpoint/waker.h"
#include "kvferry/manager.h"

namespace kvferry::bench {
inline constexpr std::string_view kComp = "bench";
inline constexpr int64_t kPrefillLingerNs = 300'000'000;  // idle after the window: late metadata still served
inline constexpr int64_t kDrainCapNs = 20'000'000'000;    // after the window, open rooms get this long

inline int fail_start(const std::string& what) {
  log_event(LogLevel::kCritical, kComp, "cannot start: " + what);
  flush_logging();
  return 2;
}

// --page-order random: a fixed permutation per (room, chunk), so runs are repeatable.
inline void shuffle_pages(std::vector<uint64_t>& pages, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::shuffle(pages.begin(), pages.end(), rng);
}

inline bool write_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) return false;
    f << text;
    if (!f) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

struct Go {
  int64_t start = 0, window_start = 0, window_end = 0;
};

inline std::optional<Go> read_go(const std::string& dir) {
  std::ifstream f(dir + "/go");
  Go g;
  if (!(f >> g.start >> g.window_start >> g.window_end)) return std::nullopt;
  return g;
}

// One room as this rank saw it.
struct Sample {
  uint64_t room = 0;
  int64_t start_ns = 0;  // prefill: first send(); decode: init()
  int64_t end_ns = 0;    // Success
  uint64_t bytes = 0;    // prefill: bytes written
  int64_t compute_end_ns = 0;  // prefill with the compute model: its last layer's compute ended
};

// What both roles share: the loop plumbing and the measurements.
class RankRun {
 public:
  // Samples of the rooms go to a scratch file as they come (a fixed stdio buffer), not
  // to memory: the rank's resident memory must not grow with the rooms it served.
  RankRun(const BenchRankOptions& o, Manager& manager, const std::string& name)
      : o_(o), manager_(manager), samples_path_(o.dir + "/" + name + ".samples") {
    samples_ = std::fopen(samples_path_.c_str(), "w+b");
  }
  ~RankRun() {
    if (samples_) {
      std::fclose(samples_);
      std::remove(samples_path_.c_str());
    }
  }
  RankRun(const RankRun&) = delete;
  RankRun& operator=(const RankRun&) = delete;

  // Waits up to `timeout_ms` for the manager's fds, then one round of its progress (control
  // frames, transport completions to the chunk hook, deadlines).
  void pump(int timeout_ms) {
    std::vector<int> fds = manager_.wait_fds();
    wait_readable(fds.data(), static_cast<int>(fds.size()), timeout_ms);
    manager_.progress();
  }
  // The same, waiting at most until `deadline_ns` (ns precision: the compute model's layer ends)
  // and never longer than 1 ms.
  void pump_until(int64_t deadline_ns) {
    const int64_t wait = std::clamp<int64_t>(deadline_ns - monotonic_ns(), 0, 1'000'000);
    std::vector<pollfd> p;
    for (int fd : manager_.wait_fds())
      if (fd >= 0) p.push_back({fd, POLLIN, 0});
    const timespec ts{0, static_cast<long>(wait)};
    ::ppoll(p.data(), p.size(), &ts, nullptr);
    manager_.progress();
  }

  void window_tick(int64_t now, uint64_t done_total) {
    if (!window_started_ && now >= go_.window_start) {
      window_started_ = true;
      cpu_start_ = cpu_seconds();
      rss_start_ = read_rss();
      faults_start_ = read_faults();
      writes_start_ = manager_.stats().transport.writes;
      rooms_at_start_ = done_total;
    }
    if (window_started_ && !window_ended_ && now >= go_.window_end) {
      window_ended_ = true;
      cpu_end_ = cpu_seconds();
      rss_end_ = read_rss();
      faults_end_ = read_faults();
      writes_end_ = manager_.stats().transport.writes;
    }
    if (o_.rss_checkpoint && !checkpoint_taken_ && done_total >= o_.rss_checkpoint) {
      checkpoint_taken_ = true;
      rss_checkpoint_ = read_rss();
    }
  }

  // Every finished room, warm-up and drain included: a room in flight at an edge of the window
  // counts in part (summary.h), and which rooms completed inside the window is decided over all
  // ranks of a side by the summary.
  void record(const Sample& s) {
    ++done_total_;
    if (samples_ && std::fwrite(&s, sizeof s, 1, samples_) != 1) samples_failed_ = true;
  }

  int finish(const std::string& name, uint64_t failed, uint64_t open_at_exit) {
    if (!window_ended_) {  // should not happen; measure now so the file is complete
      cpu_end_ = cpu_seconds();
      rss_end_ = read_rss();
      faults_end_ = read_faults();
      writes_end_ = manager_.stats().transport.writes;
    }
    nlohmann::json j;
    j["name"] = name;
    j["role"] = o_.prefill ? "prefill" : "decode";
    j["tp_rank"] = o_.tp_rank;
    j["cpu_s"] = cpu_end_ - cpu_start_;
    j["rooms_total"] = done_total_;
    j["rooms_before_window"] = rooms_at_start_;
    j["failed"] = failed;
    j["open_at_exit"] = open_at_exit;
    j["rss_start"] = rss_start_.to_json();
    j["rss_end"] = rss_end_.to_json();
    if (checkpoint_taken_) j["rss_checkpoint"] = rss_checkpoint_.to_json();
    j["pool_bytes"] = manager_.layout().total_bytes();
    // Page faults inside the window (docs/BENCHMARKS.md "Page faults") and whether the pool is
    // locked (docs/transport.md "Resident memory").
    j["minor_faults"] = faults_end_.minor - faults_start_.minor;
    j["major_faults"] = faults_end_.major - faults_start_.major;
    const TransportStats ts = manager_.stats().transport;
    j["locked_bytes"] = ts.locked_bytes;
    j["unlocked_bytes"] = ts.unlocked_bytes;
    j["residency_warnings"] = ts.residency_warnings;
    j["tcp_sockets_tuned"] = ts.tcp_sockets_tuned;
    j["tcp_congestion_failures"] = ts.tcp_congestion_failures;
    j["writes"] = writes_end_ - writes_start_;  // transport operations (puts / messages) in the window
    if (!samples_ || samples_failed_ || std::fflush(samples_) != 0)
      return fail_start("cannot write the room samples to " + samples_path_);
    nlohmann::json rooms = nlohmann::json::array();
    std::rewind(samples_);
    for (Sample s; std::fread(&s, sizeof s, 1, samples_) == 1;)
      rooms.push_back({s.room, s.start_ns, s.end_ns, s.bytes, s.compute_end_ns});
    j["rooms"] = std::move(rooms);
    if (!write_file(o_.dir + "/" + name + ".json", j.dump())) return fail_start("cannot write result file");
    flush_logging();
    return 0;
  }

  Go go_;
  uint64_t done_total_ = 0;

 private:
  const BenchRankOptions& o_;
  Manager& manager_;
  bool window_started_ = false, window_ended_ = false, checkpoint_taken_ = false;
  double cpu_start_ = 0, cpu_end_ = 0;
  RssSample rss_start_, rss_end_, rss_checkpoint_;
  FaultSample faults_start_, faults_end_;
  uint64_t writes_start_ = 0, writes_end_ = 0;
  uint64_t rooms_at_start_ = 0;
  std::string samples_path_;
  std::FILE* samples_ = nullptr;
  bool samples_failed_ = false;
};

// Waits for DIR/go, pumping the endpoint (heartbeats, registrations) meanwhile.
template <class Pump>
inline std::optional<Go> wait_go(const BenchRankOptions& o, Pump&& pump) {
  int64_t deadline = monotonic_ns() + static_cast<int64_t>(o.timeout_s * 1e9);
  while (monotonic_ns() < deadline) {
    if (auto g = read_go(o.dir)) return g;
    pump();
  }
  return std::nullopt;
}

}  // namespace kvferry::bench
