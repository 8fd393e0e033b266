// DecodeEndpoint: no status is lost for good (decode_endpoint.h; docs/failure-model.md "Lost
// statuses"). A room whose source owes it a status (WaitingForInput: the source's Success or
// Failed; Failed: the source's terminal status, its drain confirmation) asks that source again
// status_retry_ms after the metadata went out (or after the failure), then after twice that, up
// to kMaxAsks times. The ask is the room's metadata again: idempotent at the source, which keeps
// the first and answers a repeat with the status it sent (Success, or Failed, terminal only once
// none of its writes can land), or nothing while the room is still in progress there. A failed
// room also repeats its own failure (the source may have lost it; its registry drops
// duplicates). Nothing here grows with what a peer sends: the state is two fields per room.
//
// A failure status the control socket refuses (its queue to the source is full: a burst of rooms
// failing at once) is held and sent again from tick(), in order per source, up to
// kMaxHeldStatuses in all. Without it a room that failed before its metadata went out (a decode
// request aborted while it waited for memory) has nothing that asks again, and its source would
// wait for its bootstrap deadline and report a timeout instead of the cause.
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
      md.integrity = core_.config().integrity;  // as the first: it may be the one that arrives
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

void DecodeEndpoint::send_or_hold(const RankId& src, const std::string& endpoint, const RoomStatus& st) {
  auto held = held_statuses_.find(src);
  if (held == held_statuses_.end() || held->second.empty()) {
    Status s = core_.send(endpoint, st);
    if (s.ok()) return;
    log_event(LogLevel::kDebug, kComp, "failure not delivered, held to send again: " + s.str(), {.room = st.room});
  }
  if (held_count_ >= kMaxHeldStatuses) {
    if (statuses_dropped_++ == 0)
      log_event(LogLevel::kWarning, kComp,
                fmt::format("{} failure statuses wait for full control queues: further ones are dropped (their "
                            "sources fail the rooms at their bootstrap deadline)", held_count_),
                {.room = st.room});
    return;
  }
  held_statuses_[src].push_back(st);
  ++held_count_;
}

void DecodeEndpoint::flush_held_statuses() {
  for (auto it = held_statuses_.begin(); it != held_statuses_.end();) {
    auto peer = peers_.find(it->first);
    const bool gone = peer == peers_.end() || dead_peers_.count(it->first);
    std::deque<RoomStatus>& q = it->second;
    while (!q.empty()) {
      if (gone) {  // a dead source gets its terminal statuses when it registers again (owed_)
        if (peer != peers_.end() && q.front().terminal) owed_[it->first].push_back(q.front());
      } else if (!core_.send(peer->second.control_endpoint, q.front()).ok()) {
        break;  // still full: keep the order, try at the next tick
      }
      q.pop_front();
      --held_count_;
    }
    it = q.empty() ? held_statuses_.erase(it) : std::next(it);
  }
  if (held_count_ == 0) statuses_dropped_ = 0;  // a later overflow warns again
}

}  // namespace kvferry
