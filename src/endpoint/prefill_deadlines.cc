// PrefillEndpoint's deadlines on writes (prefill_endpoint.h; docs/failure-model.md "Deadlines"):
//   - transfer deadline: a Transferring room with writes in flight, none of which completed for
//     transfer_timeout_ms (a wedged receiver, a stalled path, a stuck transport), fails with
//     transfer_error, origin this rank (the only rank that observed it), the reason naming the
//     destinations whose acknowledgement is missing;
//   - abandonment: a failed room whose writes are still in flight drain_timeout_ms after the
//     failure gives them up: its chunks are done (ok false) so the driver's staging ring moves on,
//     and the room may be released. No terminal status goes out while a write may still land, so
//     decode keeps the room's pages quarantined; when the last abandoned write completes after
//     all, the terminal Failed status tells decode the pages are no longer written (it reclaims
//     them).
#include <fmt/format.h>

#include "endpoint/prefill_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.endpoint";
}  // namespace

void PrefillEndpoint::check_write_deadlines(int64_t now_ns) {
  const Deadlines& dl = core_.config().deadlines;
  const int64_t transfer_ns = dl.transfer_timeout_ms * 1'000'000;
  const int64_t drain_ns = dl.drain_timeout_ms * 1'000'000;
  std::vector<uint64_t> stalled;
  for (auto& [id, r] : rooms_) {
    if (r.inflight == 0) continue;
    if (r.state.get() == KVPoll::Transferring && now_ns - r.progress_ns > transfer_ns) stalled.push_back(id);
    if (r.state.get() == KVPoll::Failed && !r.abandoned && r.failed_ns != 0 && now_ns - r.failed_ns > drain_ns)
      abandon(r);
  }
  for (uint64_t id : stalled) {
    const SenderRoom& r = rooms_.at(id);
    std::string dests;
    for (const RankId& d : r.dests) dests += (dests.empty() ? "" : ", ") + d.str();
    fail(id, ErrorCode::kTransferError,
         fmt::format("{} write batches to {} not acknowledged: none completed within {} ms", r.inflight, dests,
                     dl.transfer_timeout_ms),
         core_.self(), now_ns, true);
  }
}

void PrefillEndpoint::abandon(SenderRoom& r) {
  r.abandoned = true;
  abandoned_writes_ += r.inflight;
  size_t chunks = 0;
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    if (it->second.room != r.room) {
      ++it;
      continue;
    }
    abandoned_chunks_.push_back({r.room, it->first, false});
    it = chunks_.erase(it);
    ++chunks;
  }
  log_event(LogLevel::kDebug, kComp,
            fmt::format("{} writes still in flight {} ms after the failure: abandoned ({} chunks done); decode keeps "
                        "the pages quarantined until they complete",
                        r.inflight, core_.config().deadlines.drain_timeout_ms, chunks),
            {.room = r.room});
}

void PrefillEndpoint::remember_abandoned(const SenderRoom& r) {
  AbandonedRoom a;
  a.inflight = r.inflight;
  a.dests = r.dests;
  auto e = core_.registry().get(r.room);
  a.failure = e ? e->failure() : Failure{ErrorCode::kTransferError, core_.self(), "writes abandoned", 0, 0};
  abandoned_[r.room] = std::move(a);
  abandoned_order_.push_back(r.room);
  while (abandoned_order_.size() > kMaxAbandonedRooms) {  // decode's quarantine simply stays
    abandoned_.erase(abandoned_order_.front());
    abandoned_order_.pop_front();
  }
}

void PrefillEndpoint::on_abandoned_completion(uint64_t room) {
  auto it = abandoned_.find(room);
  if (it == abandoned_.end()) return;
  ++abandoned_completed_;
  if (--it->second.inflight > 0) return;
  RoomStatus st{room, core_.self(), KVPoll::Failed, it->second.failure, /*terminal=*/true};
  for (const RankId& d : it->second.dests) {
    const std::string* peer = control_endpoint_of(d);
    if (!peer) continue;
    st.peer_incarnation = incarnation_of(d);
    Status s = core_.send(*peer, st);
    if (!s.ok()) log_event(LogLevel::kDebug, kComp, "drain confirmation not delivered: " + s.str(), {.room = room});
  }
  log_event(LogLevel::kDebug, kComp, "abandoned writes completed: drain confirmed to the destinations", {.room = room});
  abandoned_.erase(it);
  std::erase(abandoned_order_, room);
}

}  // namespace kvferry
