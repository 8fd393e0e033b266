// DecodeEndpoint: quarantined rooms (decode_endpoint.h). A room released while a source it sent
// metadata to has not confirmed its drain (the drain deadline passed: drained() by deadline) is
// quarantined: its pages, aux row and state rows must not be reused, and they are counted as
// leaked (quarantined_pages()). When every such source confirms the drain after all (its terminal
// status, e.g. once abandoned writes completed, prefill_deadlines.cc) or dies (a dead process
// writes nothing more), the room is reclaimed: take_reclaimed() hands it to the owner, who may
// reuse its pages. At most kMaxQuarantined rooms are remembered (the oldest is dropped first and
// stays leaked). A source declared dead is taken as gone without a restart once its process is
// proven gone (reclaim_from_gone_sources): a killed prefill that never comes back does not keep
// the pages for good.
#include <fmt/format.h>

#include "endpoint/decode_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
}  // namespace

void DecodeEndpoint::quarantine(const ReceiverRoom& r, bool placements) {
  Quarantine q;
  for (const RankId& src : r.metadata_sent)
    if (!r.terminal.count(src)) q.pending.insert(src);
  q.placements = placements;
  if (q.pending.empty() && !placements) return;
  q.pages = r.kv_indices.size() + 1 + r.state_indices.size();  // pages, the aux row, state rows
  quarantined_pages_ += q.pages;
  ++quarantined_total_;
  quarantined_order_.push_back(r.room);
  quarantined_[r.room] = std::move(q);
  while (quarantined_order_.size() > kMaxQuarantined) {
    quarantined_.erase(quarantined_order_.front());  // stays leaked; its pages stay counted
    quarantined_order_.pop_front();
  }
  log_event(LogLevel::kDebug, kComp,
            fmt::format("released quarantined: {} pages and rows wait for {} source(s) to confirm the drain{}",
                        quarantined_.at(r.room).pages, quarantined_.at(r.room).pending.size(),
                        placements ? " and for writes still being placed" : ""),
            {.room = r.room});
}

void DecodeEndpoint::drain_confirmed(uint64_t room, const RankId& src) {
  auto it = quarantined_.find(room);
  if (it == quarantined_.end() || !it->second.pending.erase(src) || !it->second.pending.empty()) return;
  if (it->second.placements) return;  // the fence's last placements end it (tick_fences)
  end_quarantine(room, src.str() + " confirmed the drain");
}

void DecodeEndpoint::end_quarantine(uint64_t room, const std::string& why) {
  auto it = quarantined_.find(room);
  if (it == quarantined_.end()) return;
  quarantined_pages_ -= it->second.pages;
  ++reclaimed_total_;
  if (reclaimed_.size() < kMaxQuarantined) reclaimed_.push_back(room);
  log_event(LogLevel::kDebug, kComp,
            fmt::format("quarantine ends: {}, {} pages and rows reclaimed", why, it->second.pages),
            {.room = room});
  quarantined_.erase(it);
  std::erase(quarantined_order_, room);
}

void DecodeEndpoint::reclaim_from_gone_sources(int64_t now_ns) {
  std::set<RankId> waited_for;
  for (const auto& [room, q] : quarantined_)
    for (const RankId& src : q.pending)
      if (dead_peers_.count(src)) waited_for.insert(src);
  for (const RankId& src : waited_for) {
    auto it = peers_.find(src);
    if (it == peers_.end() || !it->second.control_endpoint.starts_with("tcp://") || !quarantine_probes_.take(now_ns))
      continue;
    const int64_t last = monitor().last_heard_ns(src);
    const int64_t silent_ns = last == 0 ? 0 : now_ns - last;
    // Silence proves nothing (a stopped or starved process writes when it runs again); a refused
    // connect does: the socket closed with its process, and so did every thread that could write.
    // An unanswered one after a long silence (its host is gone) is enough only where this rank's
    // transport copies every write itself and its room fence refuses the late ones (tcp); over
    // shm a put is the writer's own memcpy (docs/failure-model.md "Late writes").
    const PeerMonitor::Probe p = PeerMonitor::probe(it->second.control_endpoint, 20);
    const bool gone = p == PeerMonitor::Probe::kRefused ||
                      (p == PeerMonitor::Probe::kUnanswered && silent_ns >= kHostGoneSilenceNs &&
                       core_.config().transport != "shm");
    if (!gone) continue;
    log_event(LogLevel::kDebug, kComp,
              fmt::format("{} is gone ({}): its quarantined rooms are drained of it", src.str(),
                          p == PeerMonitor::Probe::kRefused ? "its control endpoint refuses connects"
                                                            : "its host does not answer"));
    source_gone(src);
  }
}

void DecodeEndpoint::source_gone(const RankId& src) {
  std::vector<uint64_t> rooms;
  for (const auto& [room, q] : quarantined_)
    if (q.pending.count(src)) rooms.push_back(room);
  for (uint64_t room : rooms) drain_confirmed(room, src);
}

}  // namespace kvferry
