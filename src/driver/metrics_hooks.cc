#include "driver/metrics_hooks.h"

#include <array>

#include "kvferry/metrics.h"

namespace kvferry {
namespace {
constexpr int64_t kGaugePeriodNs = 50'000'000;
int64_t g_last_gauges_ns = 0;
}  // namespace

void metrics_on_step(const EngineDriver& driver, const std::vector<RoomReport>& own, int64_t now_ns, bool force) {
  RankMetrics* m = rank_metrics();
  if (!m || (!force && now_ns - g_last_gauges_ns < kGaugePeriodNs)) return;
  g_last_gauges_ns = now_ns;
  std::array<uint64_t, 5> by_state{};
  for (const RoomReport& r : own) ++by_state[static_cast<int>(r.poll)];
  m->set_rooms_in_flight(by_state);
  const RankLeakStats s = driver.leak_stats();
  m->set_leaks(s.live_rooms, s.records, s.pages_in_use, s.peers);
  m->set_incarnation_counts(s.stale_messages, s.peer_restarts);
  m->set_refusals(s.refusals);
  m->set_quarantined_pages(s.quarantined_pages);
  m->set_reclaimed_pages(s.reclaimed_pages);
  m->set_pool_residency(s.transport.locked_bytes, s.transport.unlocked_bytes, s.transport.residency_warnings);
  m->set_control_plane(s.control);
  m->set_process_resident_bytes(process_resident_bytes());
}

void metrics_on_release(const ReleasedRoom& r) {
  RankMetrics* m = rank_metrics();
  if (!m) return;
  if (r.sent_bytes) m->add_sent_bytes(r.sent_bytes);
  if (r.verified_bytes || r.mismatched_bytes) m->add_verified_bytes(r.verified_bytes, r.mismatched_bytes);
  if (r.failed) m->room_failed(r.code, r.from_another_rank);
  m->room_released(!r.failed, r.latency_s);
}

}  // namespace kvferry
