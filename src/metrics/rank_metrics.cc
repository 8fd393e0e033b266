// RankMetrics (include/kvferry/metrics.h): a fixed set of series kept in atomics, written in the
// Prometheus text exposition format 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/:
// "# HELP"/"# TYPE" lines, one sample per line, histogram buckets cumulative with le="+Inf", _sum,
// _count). The series are known when the rank starts, apart from failures by code, so no general
// client library is needed (prometheus-cpp is in Debian but not on the project's agreed list).
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <utility>

#include <unistd.h>

#include <fmt/format.h>

#include "kvferry/metrics.h"

namespace kvferry {
namespace {
// 1 ms .. 60 s: a room's transfer on one machine takes milliseconds to seconds.
constexpr std::array<double, 15> kLatencyBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5,   1,      2.5,   5,    10,   30,    60};

std::unique_ptr<RankMetrics> g_metrics;

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// A sample line: name{constant[,extra]} value. Integers are written without exponent.
void sample(std::string& out, std::string_view name, std::string_view constant, std::string_view extra,
            uint64_t value) {
  fmt::format_to(std::back_inserter(out), "{}{{{}{}{}}} {}\n", name, constant, extra.empty() ? "" : ",", extra,
                 value);
}
}  // namespace

struct RankMetrics::Impl {
  std::string constant;  // rank="...",role="..."
  std::atomic<uint64_t> ok_rooms{0}, failed_rooms{0}, sent{0}, verified{0}, mismatched{0};
  std::array<std::atomic<uint64_t>, 5> in_flight{};
  std::atomic<uint64_t> peers{0}, live_rooms{0}, records{0}, pages{0}, quarantined{0}, reclaimed{0},
      locked{0}, unlocked{0}, residency_warnings{0};
  std::array<std::atomic<uint64_t>, 4> stale{};  // registration, metadata, status, heartbeat
  std::atomic<uint64_t> peer_restarts{0};
  // frames sent, bytes sent, frames received, bytes received, heartbeats sent (counters)
  std::array<std::atomic<uint64_t>, 5> control{};
  std::atomic<uint64_t> resident{0};
  mutable std::mutex mu;  // guards the histogram and the failure series
  std::array<uint64_t, kLatencyBuckets.size()> buckets{};  // per bucket (not cumulative)
  uint64_t latency_count = 0;
  double latency_sum = 0;
  std::map<std::pair<std::string, bool>, uint64_t> failures;  // (code name, propagated) -> count
  std::map<std::string, uint64_t> refusals;  // kind -> count (guarded by mu)
};

RankMetrics::RankMetrics(const RankId& self) : impl_(std::make_unique<Impl>()) {
  impl_->constant = fmt::format("rank=\"{}\",role=\"{}\"", self.str(), role_name(self.role));
}

RankMetrics::~RankMetrics() = default;

void RankMetrics::room_released(bool success, double latency_s) {
  (success ? impl_->ok_rooms : impl_->failed_rooms).fetch_add(1, std::memory_order_relaxed);
  if (latency_s < 0) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (size_t i = 0; i < kLatencyBuckets.size(); ++i) {
    if (latency_s <= kLatencyBuckets[i]) {
      ++impl_->buckets[i];
      break;
    }
  }
  ++impl_->latency_count;
  impl_->latency_sum += latency_s;
}

void RankMetrics::add_sent_bytes(uint64_t bytes) { impl_->sent.fetch_add(bytes, std::memory_order_relaxed); }

void RankMetrics::add_verified_bytes(uint64_t verified, uint64_t mismatched) {
  impl_->verified.fetch_add(verified, std::memory_order_relaxed);
  impl_->mismatched.fetch_add(mismatched, std::memory_order_relaxed);
}

void RankMetrics::room_failed(ErrorCode code, bool from_another_rank) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ++impl_->failures[{std::string(code_name(code)), from_another_rank}];
}

void RankMetrics::set_rooms_in_flight(const std::array<uint64_t, 5>& rooms_by_state) {
  for (int i = 0; i < 5; ++i) impl_->in_flight[i].store(rooms_by_state[i], std::memory_order_relaxed);
}

void RankMetrics::set_leaks(uint64_t live_rooms, uint64_t records, uint64_t pages_in_use, uint64_t peers) {
  impl_->live_rooms.store(live_rooms, std::memory_order_relaxed);
  impl_->records.store(records, std::memory_order_relaxed);
  impl_->pages.store(pages_in_use, std::memory_order_relaxed);
  impl_->peers.store(peers, std::memory_order_relaxed);
}

void RankMetrics::set_incarnation_counts(const std::array<uint64_t, 4>& stale_by_kind, uint64_t peer_restarts) {
  auto raise = [](std::atomic<uint64_t>& a, uint64_t v) {
    uint64_t cur = a.load(std::memory_order_relaxed);
    while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  };
  for (size_t i = 0; i < 4; ++i) raise(impl_->stale[i], stale_by_kind[i]);
  raise(impl_->peer_restarts, peer_restarts);
}
void RankMetrics::set_refusals(const std::vector<std::pair<std::string, uint64_t>>& by_kind) {
  std::lock_guard lock(impl_->mu);
  for (const auto& [kind, n] : by_kind) {
    uint64_t& cur = impl_->refusals[kind];
    cur = std::max(cur, n);
  }
}
void RankMetrics::set_quarantined_pages(uint64_t pages) { impl_->quarantined.store(pages, std::memory_order_relaxed); }
void RankMetrics::set_reclaimed_pages(uint64_t pages) {
  uint64_t cur = impl_->reclaimed.load(std::memory_order_relaxed);
  while (pages > cur && !impl_->reclaimed.compare_exchange_weak(cur, pages, std::memory_order_relaxed)) {
  }
}

namespace {
void raise_to(std::atomic<uint64_t>& counter, uint64_t v) {
  uint64_t cur = counter.load(std::memory_order_relaxed);
  while (v > cur && !counter.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}
}  // namespace

void RankMetrics::set_control_plane(const std::array<uint64_t, 5>& totals) {
  for (size_t i = 0; i < totals.size(); ++i) raise_to(impl_->control[i], totals[i]);
}
void RankMetrics::set_process_resident_bytes(uint64_t bytes) {
  impl_->resident.store(bytes, std::memory_order_relaxed);
}

uint64_t process_resident_bytes() {
  // /proc/self/statm: size resident shared ... in pages (proc(5)).
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  return resident * static_cast<uint64_t>(page > 0 ? page : 4096);
}

void RankMetrics::set_pool_residency(uint64_t locked_bytes, uint64_t unlocked_bytes, uint64_t warnings) {
  impl_->locked.store(locked_bytes, std::memory_order_relaxed);
  impl_->unlocked.store(unlocked_bytes, std::memory_order_relaxed);
  impl_->residency_warnings.store(warnings, std::memory_order_relaxed);
}

std::string RankMetrics::exposition() const {
  const Impl& m = *impl_;
  const std::string& c = m.constant;
  std::string out;
  out.reserve(4096);
  auto simple = [&](std::string_view name, std::string_view type, std::string_view help,
                    const std::atomic<uint64_t>& v) {
    header(out, name, type, help);
    sample(out, name, c, "", v.load(std::memory_order_relaxed));
  };
  header(out, "kvferry_rooms_total", "counter", "Rooms released on this rank, by outcome");
  sample(out, "kvferry_rooms_total", c, "outcome=\"success\"", m.ok_rooms.load());
  sample(out, "kvferry_rooms_total", c, "outcome=\"failed\"", m.failed_rooms.load());
  simple("kvferry_sent_bytes_total", "counter", "Prefill: KV and aux bytes written by this rank", m.sent);
  simple("kvferry_verified_bytes_total", "counter", "Decode: KV bytes verified by this rank", m.verified);
  simple("kvferry_mismatched_bytes_total", "counter", "Decode: KV bytes that did not match", m.mismatched);
  header(out, "kvferry_failures_total", "counter",
         "Failed rooms by error code and by whether this rank observed the root cause (local) or learned "
         "it from another rank (propagated)");
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (const auto& [key, n] : m.failures) {
      sample(out, "kvferry_failures_total", c,
             fmt::format("code=\"{}\",origin_kind=\"{}\"", key.first, key.second ? "propagated" : "local"), n);
    }
    header(out, "kvferry_transfer_latency_seconds", "histogram",
           "Decode: from init() (metadata sent) to Success of a room");
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kLatencyBuckets.size(); ++i) {
      cumulative += m.buckets[i];
      sample(out, "kvferry_transfer_latency_seconds_bucket", c, fmt::format("le=\"{}\"", kLatencyBuckets[i]),
             cumulative);
    }
    sample(out, "kvferry_transfer_latency_seconds_bucket", c, "le=\"+Inf\"", m.latency_count);
    fmt::format_to(std::back_inserter(out), "kvferry_transfer_latency_seconds_sum{{{}}} {}\n", c, m.latency_sum);
    sample(out, "kvferry_transfer_latency_seconds_count", c, "", m.latency_count);
  }
  header(out, "kvferry_rooms_in_flight", "gauge", "Live rooms by KVPoll state");
  for (int i = 0; i < 5; ++i) {
    sample(out, "kvferry_rooms_in_flight", c, fmt::format("state=\"{}\"", to_string(static_cast<KVPoll>(i))),
           m.in_flight[i].load());
  }
  simple("kvferry_peer_connections", "gauge", "Peer ranks of the other engine this rank is connected to", m.peers);
  simple("kvferry_live_rooms", "gauge", "Rooms held by the driver and the endpoint (leak counter)", m.live_rooms);
  simple("kvferry_registry_records", "gauge", "Failure registry records (leak counter)", m.records);
  simple("kvferry_pages_in_use", "gauge", "Pool pages and aux slots in use (leak counter)", m.pages);
  header(out, "kvferry_stale_messages_total", "counter",
         "Messages refused because they came from an older incarnation of their sender or were meant for an "
         "earlier incarnation of this rank, by kind");
  constexpr std::array<std::string_view, 4> kKinds = {"registration", "metadata", "status", "heartbeat"};
  for (size_t i = 0; i < kKinds.size(); ++i)
    sample(out, "kvferry_stale_messages_total", c, fmt::format("kind=\"{}\"", kKinds[i]), m.stale[i].load());
  simple("kvferry_peer_restarts_total", "counter", "Peers of the other engine seen back as a new incarnation",
         m.peer_restarts);
  {
    std::lock_guard lock(m.mu);
    if (!m.refusals.empty()) {
      header(out, "kvferry_refused_frames_total", "counter", "Frames refused from peers, by kind (docs/security.md)");
      for (const auto& [kind, n] : m.refusals)
        sample(out, "kvferry_refused_frames_total", c, fmt::format("kind=\"{}\"", kind), n);
    }
  }
  simple("kvferry_quarantined_pages", "gauge",
         "Pages and aux rows quarantined: leaked until the prefill confirms the drain (leak counter)", m.quarantined);
  simple("kvferry_reclaimed_pages_total", "counter",
         "Pages and aux rows given back to the pool after their quarantine ended on every rank of the engine",
         m.reclaimed);
  simple("kvferry_pool_locked_bytes", "gauge", "Registered memory of this rank locked in RAM (mlock)", m.locked);
  simple("kvferry_pool_unlocked_bytes", "gauge",
         "Registered memory of this rank that could not be locked (RLIMIT_MEMLOCK / CAP_IPC_LOCK): it may "
         "be reclaimed and faulted in again during transfers",
         m.unlocked);
  simple("kvferry_pool_residency_warnings_total", "counter",
         "Spans (own, or a peer's shared memory as mapped here) that could not be locked or pre-faulted",
         m.residency_warnings);
  header(out, "kvferry_control_frames_total", "counter",
         "Frames through this rank's control socket (received includes peers' heartbeats)");
  sample(out, "kvferry_control_frames_total", c, "direction=\"sent\"", m.control[0].load());
  sample(out, "kvferry_control_frames_total", c, "direction=\"received\"", m.control[2].load());
  header(out, "kvferry_control_bytes_total", "counter", "Bytes of the frames through this rank's control socket");
  sample(out, "kvferry_control_bytes_total", c, "direction=\"sent\"", m.control[1].load());
  sample(out, "kvferry_control_bytes_total", c, "direction=\"received\"", m.control[3].load());
  simple("kvferry_heartbeats_sent_total", "counter", "Heartbeat frames this rank sent to its peers", m.control[4]);
  simple("process_resident_memory_bytes", "gauge", "Resident memory of this rank's process", m.resident);
  return out;
}

void init_rank_metrics(const RankId& self) {
  if (!g_metrics) g_metrics = std::make_unique<RankMetrics>(self);
}

RankMetrics* rank_metrics() { return g_metrics.get(); }

Status write_metrics_file(const RankMetrics& metrics, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << metrics.exposition();
    if (!out.flush()) return {ErrorCode::kInternal, "cannot write " + tmp};
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return {ErrorCode::kInternal, "cannot rename " + tmp};
  return Status::Ok();
}

}  // namespace kvferry
