// DecodeEndpoint: quarantined rooms (decode_endpoint.h). A room released while a source it sent
// metadata to has not confirmed its drain (the drain deadline passed: drained() by deadline) is
// quarantined: its pages, aux row and state rows must not be reused, and they are counted as
// leaked (quarantined_pages()). When every such source confirms the drain after all (its terminal
// status, e.g. once abandoned writes completed, prefill_deadlines.cc) or dies (a dead process
// writes nothing more), the room is reclaimed: take_reclaimed() hands it to the owner, who may
// reuse its pages. At most kMaxQuarantined rooms are remembered (the oldest is dropped first and
// stays leaked).
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

void DecodeEndpoint::source_gone(const RankId& src) {
  std::vector<uint64_t> rooms;
  for (const auto& [room, q] : quarantined_)
    if (q.pending.count(src)) rooms.push_back(room);
  for (uint64_t room : rooms) drain_confirmed(room, src);
}

}  // namespace kvferry
