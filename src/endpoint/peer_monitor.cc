#include "endpoint/peer_monitor.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <memory>

#include <fmt/format.h>

#include "core/tcp_probe.h"
#include "core/thread_priority.h"
#include "kvferry/control.h"
#include "kvferry/log.h"
#include "kvferry/messages.h"
#include "kvferry/net.h"

namespace kvferry {
namespace {

// How long the leaving heartbeat may still be on its way after the heartbeat socket closes.
constexpr int kLeavingLingerMs = 200;

// KVFERRY_LIVENESS_NICE: -20..0 (0: leave the threads' priority alone); anything else: the default.
int liveness_nice() {
  const char* v = std::getenv("KVFERRY_LIVENESS_NICE");
  if (v == nullptr || *v == '\0') return PeerMonitor::kLivenessNice;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n >= -20 && n <= 0) ? static_cast<int>(n) : PeerMonitor::kLivenessNice;
}

}  // namespace

void PeerMonitor::GapHistogram::add(int64_t gap_ns) {
  const int64_t ms = std::max<int64_t>(0, gap_ns / 1'000'000);
  size_t i = ms < int64_t(kFine) ? size_t(ms)
             : ms < 10'000      ? kFine + size_t((ms - int64_t(kFine)) / 10)
                                : kFine + kCoarse;
  ++buckets[i];
  ++count;
  max_ns = std::max(max_ns, gap_ns);
}

double PeerMonitor::GapHistogram::percentile_ms(double q) const {
  if (count == 0) return 0;
  const uint64_t rank = std::max<uint64_t>(1, uint64_t(q * double(count) + 0.999999));
  uint64_t seen = 0;
  for (size_t i = 0; i <= kFine + kCoarse; ++i) {
    seen += buckets[i];
    if (seen < rank) continue;
    // The bucket's upper edge, but never above the largest gap seen.
    const double edge = i < kFine ? double(i + 1) : i < kFine + kCoarse ? double(kFine + (i - kFine + 1) * 10)
                                                                        : double(max_ns) / 1e6;
    return std::min(edge, double(max_ns) / 1e6);
  }
  return double(max_ns) / 1e6;
}

PeerMonitor::PeerMonitor(RankId self, const Deadlines& deadlines, ListenAddress heartbeat, uint64_t incarnation)
    : PeerMonitor(self, deadlines, std::move(heartbeat), Options{.stall_credit = true, .incarnation = incarnation}) {}

PeerMonitor::PeerMonitor(RankId self, const Deadlines& deadlines, ListenAddress heartbeat, Options options)
    : self_(self),
      incarnation_(options.incarnation != 0 ? options.incarnation : 1),
      deadlines_(deadlines),
      heartbeat_(std::move(heartbeat)),
      stall_(2 * deadlines.heartbeat_interval_ms * 1'000'000),
      nice_(liveness_nice()),
      options_(options),
      thread_([this] { run(); }) {}

void PeerMonitor::tick_stall_clock(int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  stall_.tick(now_ns);
}

PeerMonitor::~PeerMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  const LivenessStats s = stats();
  log_event(LogLevel::kDebug, "monitor",
            fmt::format("liveness: {} gaps between frames of a peer, p50 {:.0f} ms, p99 {:.0f} ms, max {:.0f} ms; "
                        "{} silences past {} ms, {} of them a busy peer (endpoint accepting), {} a silent network (probe "
                        "unanswered), {} reported dead, "
                        "{} heard again; own stalls {:.0f} ms (longest {:.0f} ms); heartbeat thread nice {}, "
                        "ZeroMQ I/O nice {}",
                        s.gaps, s.gap_p50_ms, s.gap_p99_ms, s.gap_max_ms, s.suspected,
                        deadlines_.heartbeat_timeout_ms, s.probed_alive, s.probed_silent, s.reported, s.revived, s.stalled_ms,
                        s.max_stall_ms, s.heartbeat_nice, s.io_nice),
            {.extra = {{"event", "liveness"},
                       {"gaps", std::to_string(s.gaps)},
                       {"gap_p50_ms", fmt::format("{:.0f}", s.gap_p50_ms)},
                       {"gap_p99_ms", fmt::format("{:.0f}", s.gap_p99_ms)},
                       {"gap_max_ms", fmt::format("{:.0f}", s.gap_max_ms)},
                       {"suspected", std::to_string(s.suspected)},
                       {"probed_alive", std::to_string(s.probed_alive)},
                       {"probed_silent", std::to_string(s.probed_silent)},
                       {"reported", std::to_string(s.reported)},
                       {"revived", std::to_string(s.revived)},
                       {"stalled_ms", fmt::format("{:.0f}", s.stalled_ms)},
                       {"heartbeat_nice", std::to_string(s.heartbeat_nice)}}});
}

LivenessStats PeerMonitor::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  LivenessStats s = counts_;
  s.gaps = gaps_.count;
  s.gap_p50_ms = gaps_.percentile_ms(0.50);
  s.gap_p99_ms = gaps_.percentile_ms(0.99);
  s.gap_max_ms = double(gaps_.max_ns) / 1e6;
  s.stalled_ms = double(stall_.stalled_ns()) / 1e6;
  s.max_stall_ms = double(stall_.max_stall_ns()) / 1e6;
  return s;
}

void PeerMonitor::watch(const RankId& peer, const std::string& control_endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  Peer p;
  p.endpoint = control_endpoint;
  p.last_heard_ns = monotonic_ns();
  p.stalled_at = stall_.stalled_ns();
  peers_[peer] = std::move(p);
}

void PeerMonitor::unwatch(const RankId& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_.erase(peer);
}

int64_t PeerMonitor::last_heard_ns(const RankId& peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  return it == peers_.end() || !it->second.heard_once ? 0 : it->second.last_heard_ns;
}

void PeerMonitor::heard(const RankId& peer, int64_t now_ns, bool proven) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  Peer& p = it->second;
  if (p.reported && !proven) {
    p.unproven = true;  // a forged heartbeat must not keep a dead peer looking alive
    return;
  }
  if (p.heard_once && now_ns > p.last_heard_ns) gaps_.add(now_ns - p.last_heard_ns);
  p.heard_once = true;
  p.last_heard_ns = now_ns;
  p.stalled_at = stall_.stalled_ns();
  p.probed_ns = 0;
  p.suspected = false;
  if (p.reported) {
    p.reported = false;
    p.revived = true;
    ++counts_.revived;
  }
}

void PeerMonitor::mark_dead(const RankId& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it != peers_.end()) it->second.reported = true;
}

std::vector<RankId> PeerMonitor::take_unproven() {
  std::vector<RankId> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [rank, p] : peers_) {
    if (p.unproven) {
      p.unproven = false;
      if (p.reported) out.push_back(rank);
    }
  }
  return out;
}

std::vector<RankId> PeerMonitor::take_revived() {
  std::vector<RankId> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [rank, p] : peers_) {
    if (p.revived) {
      p.revived = false;
      out.push_back(rank);
    }
  }
  return out;
}

std::vector<DeadPeer> PeerMonitor::take_dead(int64_t now_ns) {
  std::vector<DeadPeer> out;
  std::lock_guard<std::mutex> lock(mu_);
  // The judge's own stop counts before any verdict: a process stopped (SIGSTOP, a paused VM) runs
  // its main thread again before its heartbeat thread has woken up and ticked, and would take
  // everyone's silence during its own stop for theirs. Real time only (tests judge at a future
  // `now_ns`).
  if (options_.stall_credit) stall_.tick(monotonic_ns());
  for (auto& [rank, p] : peers_) {
    // The silence this process was scheduled for (core/stall_clock.h); reported: the whole one.
    const int64_t silent = options_.stall_credit ? stall_.silence(now_ns, p.last_heard_ns, p.stalled_at)
                                                 : now_ns - p.last_heard_ns;
    const int64_t timeout_ns = deadlines_.heartbeat_timeout_ms * 1'000'000;
    if (p.reported || silent <= timeout_ns) continue;
    if (!p.suspected) {
      p.suspected = true;
      ++counts_.suspected;
    }
    if (silent <= kHungFactor * timeout_ns) {
      // Suspected: confirmed at once if the peer's endpoint refuses; not before kHungFactor x the
      // timeout while it accepts (busy or hung), nor before kUnreachableFactor x while the network
      // does not answer at all.
      const int64_t real_now = monotonic_ns();
      if (p.probed_ns == 0 || real_now - p.probed_ns >= kProbeIntervalMs * 1'000'000) {
        const bool first = p.probed_ns == 0;
        p.probe = probe(p.endpoint, 20);
        p.probed_ns = real_now;
        if (first && p.probe == Probe::kAccepts) ++counts_.probed_alive;
        if (first && p.probe == Probe::kUnanswered) ++counts_.probed_silent;
      }
      if (p.probe == Probe::kAccepts) continue;
      if (p.probe == Probe::kUnanswered && silent <= kUnreachableFactor * timeout_ns) continue;
    }
    p.reported = true;
    ++counts_.reported;
    out.push_back({rank, (now_ns - p.last_heard_ns) / 1'000'000});
  }
  return out;
}

PeerMonitor::Probe PeerMonitor::probe(const std::string& endpoint, int timeout_ms) {
  return probe_tcp_endpoint(endpoint, timeout_ms);
}

bool PeerMonitor::endpoint_accepts(const std::string& endpoint, int timeout_ms) {
  return probe(endpoint, timeout_ms) == Probe::kAccepts;
}

size_t PeerMonitor::watched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peers_.size();
}

void PeerMonitor::run() {
  // Busy is not dead: this thread and ZeroMQ's I/O threads (started with the first socket) carry
  // every heartbeat; they sleep nearly always and must run as soon as they wake.
  const int hb_nice = nice_ < 0 ? raise_thread_priority(0, nice_) : thread_nice(0);
  ListenAddress address = heartbeat_;
  address.port = 0;
  auto sock = ControlSocket::bind(address);
  // ZeroMQ names its I/O thread from inside that thread, so right after the first socket the
  // thread may exist unnamed (seen on a loaded host): look again at every beat until it is found.
  bool io_seen = false;
  auto raise_io_threads = [&] {
    int io_nice = 0;
    for (int tid : threads_named("ZMQbg/IO/")) {
      const int n = nice_ < 0 ? raise_thread_priority(tid, nice_) : thread_nice(tid);
      io_nice = io_seen ? std::max(io_nice, n) : n;
      io_seen = true;
    }
    return io_nice;
  };
  {
    const int io_nice = raise_io_threads();
    std::lock_guard<std::mutex> lock(mu_);
    counts_.heartbeat_nice = hb_nice;
    counts_.io_nice = io_nice;
  }
  if (!sock.ok()) return;  // no heartbeats: peers will time us out, which is the honest outcome
  uint64_t seq = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!io_seen) {
      lock.unlock();
      const int io_nice = raise_io_threads();
      lock.lock();
      if (io_seen) counts_.io_nice = io_nice;
    }
    std::vector<std::string> endpoints;
    for (auto& [rank, p] : peers_) endpoints.push_back(p.endpoint);
    lock.unlock();
    Heartbeat hb{self_, ++seq, monotonic_ns(), incarnation_};
    std::string frame = encode(hb);
    uint64_t sent = 0;
    for (const std::string& ep : endpoints) sent += (*sock)->send(ep, frame).ok() ? 1 : 0;
    (void)(*sock)->recv(std::chrono::milliseconds(0));  // lets held frames go out
    lock.lock();
    counts_.heartbeats_sent += sent;
    cv_.wait_for(lock, std::chrono::milliseconds(deadlines_.heartbeat_interval_ms), [&] { return stop_; });
    if (options_.stall_credit) stall_.tick(monotonic_ns());
  }
  // An orderly stop (a crash never gets here): the last heartbeat says this rank is leaving, so a
  // peer with nothing in flight with it forgets it without taking its silence for a death.
  std::vector<std::string> endpoints;
  for (auto& [rank, p] : peers_) endpoints.push_back(p.endpoint);
  lock.unlock();
  Heartbeat bye{self_, ++seq, monotonic_ns(), incarnation_};
  bye.leaving = true;
  const std::string frame = encode(bye);
  for (const std::string& ep : endpoints) (void)(*sock)->send(ep, frame);
  (*sock)->linger(std::chrono::milliseconds(kLeavingLingerMs));
}

}  // namespace kvferry
