// DecodeEndpoint: no status is lost for good (decode_endpoint.h; docs/failure-model.md "Lost
// statuses"). A room whose source owes it a status (WaitingForInput: the source's Success or
// Failed; Failed: the source's terminal status, its drain confirmation) asks that source again
// status_retry_ms after the metadata went out (or after the failure), then after twice that, up
// to kMaxAsks times. The ask is the room's metadata again: idempotent at the source, which keeps
// the first and answers a repeat with the status it sent (Success, or Failed, terminal only once
// none of its writes can land), or nothing while the room is still in progress there. A failed
// room also repeats its own failure (the source may have lost it; its registry drops
// duplicates). Nothing here grows with what a peer sends: the state is two fields per room.
#include <fmt/format.h>

#include <algorithm>

#include "endpoint/decode_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
}  // namespace

void DecodeEndpoint::arm_reask(ReceiverRoom& r, int64_t now_ns) {
  if (r.metadata_sent.empty() || r.asks >= kMaxAsks) return;
  const int64_t base = core_.config().deadlines.status_retry_ms * 1'000'000;
  r.next_ask_ns = now_ns + (base << std::min<uint32_t>(r.asks, 5));
}

void DecodeEndpoint::reask(int64_t now_ns) {
  for (auto& [id, r] : rooms_) {
    if (r.next_ask_ns == 0 || now_ns < r.next_ask_ns) continue;
    r.next_ask_ns = 0;
    const KVPoll state = r.state.get();
    if (state != KVPoll::WaitingForInput && state != KVPoll::Failed) continue;
    std::optional<KVTransferError> failure;
    if (state == KVPoll::Failed && r.failure_told) failure = core_.registry().get(id);
    size_t asked = 0;
    for (const RankId& src : r.metadata_sent) {
      // A source that succeeded or sent its terminal status owes nothing; a dead one is handled
      // by peer death.
      if (r.terminal.count(src) || r.succeeded.count(src) || dead_peers_.count(src)) continue;
      auto peer = peers_.find(src);
      if (peer == peers_.end()) continue;
      RoomMetadata md{r.room, core_.self(), r.kv_indices, r.aux_index, r.state_indices,
                      static_cast<uint32_t>(r.sources.size())};
      md.peer_incarnation = peer->second.incarnation;  // kvferry/messages.h
      Status s = core_.send(peer->second.control_endpoint, md);
      if (s.ok() && failure) {
        RoomStatus st{r.room, core_.self(), KVPoll::Failed, failure->failure(), r.final_told};
        st.peer_incarnation = peer->second.incarnation;
        s = core_.send(peer->second.control_endpoint, st);
      }
      if (!s.ok()) log_event(LogLevel::kDebug, kComp, "ask not delivered: " + s.str(), {.room = id});
      ++asked;
    }
    if (asked == 0) continue;
    ++r.asks;
    status_asks_ += asked;
    log_event(LogLevel::kDebug, kComp,
              fmt::format("no status from {} source(s) yet: asked again ({} of {})", asked, r.asks, kMaxAsks),
              {.room = id});
    arm_reask(r, now_ns);
  }
}

}  // namespace kvferry
