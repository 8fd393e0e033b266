// PrefillEndpoint's side of the room metadata (prefill_endpoint.h): a destination's metadata
// checked against its registration (the newest: connecting, else connected) and the room's page
// count, kept for a room not added yet (bounded), answered with the cause for a failed or released
// room, and a repeat (a destination that asks again for a status it lost, decode_reask.cc)
// answered with the status it is owed, never stored.
#include <fmt/format.h>

#include <algorithm>

#include "endpoint/prefill_endpoint.h"
#include "endpoint/topology.h"
#include "kvferry/log.h"
#include "kvferry/routing.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.endpoint";

LogFields room_fields(uint64_t room) {
  LogFields f;
  f.room = room;
  return f;
}
}  // namespace

bool PrefillEndpoint::is_destination(uint64_t room, const RankId& r) const {
  if (r.role != Role::kDecode || r.dp_rank != dp_rank_for_room(room, decode_dp_)) return false;
  // A room bound to a decode instance hears from its ranks only (prefill_instances.cc); a room not
  // bound yet from the ranks of an instance known here (registered, or refused with a record).
  if (std::optional<uint32_t> e = bound_engine(room); e ? *e != r.engine_id : !known_instance(r.engine_id))
    return false;
  for (uint32_t d : dests_of(plan_, core_.self().tp_rank))
    if (d == r.tp_rank) return true;
  return false;
}

bool PrefillEndpoint::from_destination(std::string_view kind, uint64_t room, const RankId& sender) {
  if (is_destination(room, sender)) return true;
  ++foreign_messages_;
  LogFields f = room_fields(room);
  f.extra.push_back({"event", "foreign_refused"});
  core_.peer_debug(kComp, fmt::format("{} from {} refused: not a destination of the room", kind, sender.str()), f);
  return false;
}

void PrefillEndpoint::on_metadata(const RoomMetadata& md) {
  if (!from_destination("metadata", md.room, md.sender)) return answer_other_instance(md);
  auto it = rooms_.find(md.room);
  if (it != rooms_.end()) return apply_metadata(it->second, md);
  if (answer_released(md.room, md.sender)) {  // the room is gone: answered, not resurrected
    core_.peer_debug(kComp, "metadata for a released room ignored", room_fields(md.room));
    return;
  }
  if (self_leaving_ && !coming_.count(md.room)) return answer_leaving(md);
  auto pending = pending_meta_.find(md.room);
  if (pending != pending_meta_.end()) {
    for (const auto& [ns, m] : pending->second)
      if (m.sender == md.sender) return;  // asked again before the room exists: the first is kept
  }
  // Bounded in rooms, senders per room, entries and indices per sender and indices in all
  // (prefill_endpoint.h, kMaxPending*): a peer's flood for rooms that never come costs it its
  // own quota, not another peer's metadata.
  const uint64_t indices = md.kv_indices.size() + md.state_indices.size();
  PendingQuota* q = nullptr;
  if (auto it = pending_quota_.find(md.sender); it != pending_quota_.end()) q = &it->second;
  const char* full = nullptr;
  if (pending == pending_meta_.end() && pending_meta_.size() >= kMaxPendingRooms) full = "too many rooms pending";
  else if (pending != pending_meta_.end() && pending->second.size() >= kMaxPendingSenders) full = "too many senders";
  else if (q && q->entries >= kMaxPendingPerSender) full = "too many pending from this sender";
  else if (q && q->indices + indices > kMaxPendingIndicesPerSender) full = "too many indices pending from this sender";
  else if (pending_indices_ + indices > kMaxPendingIndices) full = "too many indices pending";
  if (full) {
    ++dropped_pending_;
    core_.peer_debug(kComp, fmt::format("metadata from {} for a room not added yet dropped: {}", md.sender.str(), full),
                     room_fields(md.room));
    return;
  }
  PendingQuota& quota = pending_quota_[md.sender];
  ++quota.entries;
  quota.indices += indices;
  ++pending_entries_;
  pending_indices_ += indices;
  pending_meta_[md.room].push_back({monotonic_ns(), md});
}

std::vector<std::pair<int64_t, RoomMetadata>> PrefillEndpoint::take_pending_meta(uint64_t room) {
  auto pm = pending_meta_.find(room);
  if (pm == pending_meta_.end()) return {};
  auto list = std::move(pm->second);
  pending_meta_.erase(pm);
  for (const auto& [ns, md] : list) {
    const uint64_t indices = md.kv_indices.size() + md.state_indices.size();
    --pending_entries_;
    pending_indices_ -= indices;
    auto q = pending_quota_.find(md.sender);
    if (q == pending_quota_.end()) continue;
    q->second.indices -= std::min(q->second.indices, indices);
    if (--q->second.entries == 0) pending_quota_.erase(q);
  }
  return list;
}

// Metadata from a registered rank of another decode instance for a room bound to one instance
// (prefill_instances.cc): two instances were given one room id. The late one is told at once, with
// a terminal failure (nothing is or will be written to it for this room), instead of waiting out
// its waiting deadline; nothing changes here. Only a rank with a registration here is answered, at
// the endpoint it registered (issue 33's second attack, finding 3).
void PrefillEndpoint::answer_other_instance(const RoomMetadata& md) {
  const std::optional<uint32_t> bound = bound_engine(md.room);
  if (!bound || *bound == md.sender.engine_id || !in_plan(md.sender)) return;
  answer_refused_metadata(md, ErrorCode::kInvalidArgument,
                          fmt::format("room {} is decode instance {}'s here: two decode instances were given one "
                                      "room id",
                                      md.room, *bound),
                          other_instance_line_ns_);
}

// Metadata this rank will never serve (answer_other_instance, answer_leaving): a terminal Failed
// status with this rank as origin, sent only to a rank registered here, at the endpoint it
// registered (rate-limited); this rank's line, at most one per 10 s per kind (`line_ns`).
void PrefillEndpoint::answer_refused_metadata(const RoomMetadata& md, ErrorCode code, const std::string& reason,
                                              int64_t& line_ns) {
  const std::string* peer = control_endpoint_of(md.sender);
  const int64_t now = monotonic_ns();
  if (!peer || !other_instance_answers_.take(now)) return;
  RoomStatus st{md.room, core_.self(), KVPoll::Failed,
                Failure{code, core_.self(), reason, now, wall_from_monotonic(now)}};
  st.terminal = true;
  st.peer_incarnation = incarnation_of(md.sender);
  (void)core_.send(*peer, st);
  const bool line = now - line_ns >= 10'000'000'000 || line_ns == 0;
  if (line) line_ns = now;
  LogFields f = failure_log_fields(md.room, st.failure);
  f.extra.push_back({"peer", md.sender.str()});
  log_event(line ? LogLevel::kWarning : LogLevel::kDebug, kComp,
            fmt::format("room {} failed for {}: {}", md.room, md.sender.str(), st.failure.reason), f);
}

bool PrefillEndpoint::answer_released(uint64_t room, const RankId& d) {
  auto tomb = tombstones_.find(room);
  if (tomb == tombstones_.end()) return false;
  const std::string* peer = control_endpoint_of(d);
  if (!peer) return true;
  // A room released here: what its destination was (or is) owed.
  RoomStatus st{room, core_.self(), KVPoll::Success, Failure{ErrorCode::kOk, core_.self(), "", 0, 0}};
  if (tomb->second.cause) {
    st.state = KVPoll::Failed;
    st.failure = tomb->second.cause->failure();
    st.terminal = !abandoned_.count(room);  // abandoned writes may still land
  } else {
    for (const auto& [dest, digest] : tomb->second.digests)
      if (dest == d) st.digest = digest;  // the Success it was sent, digest included
  }
  st.peer_incarnation = incarnation_of(d);
  (void)core_.send(*peer, st);
  return true;
}

void PrefillEndpoint::answer_again(SenderRoom& r, const RankId& d) {
  const std::string* peer = control_endpoint_of(d);
  if (!peer) return;
  RoomStatus st{r.room, core_.self(), r.state.get(), Failure{ErrorCode::kOk, core_.self(), "", 0, 0}};
  if (r.state.get() == KVPoll::Failed) {
    auto e = core_.registry().get(r.room);
    if (e) st.failure = e->failure();
    st.terminal = r.inflight == 0;  // terminal only once none of its writes can land
  } else if (r.state.get() != KVPoll::Success) {
    return;  // in progress: its status comes when there is one
  } else {
    st.digest = digest_for(r, d);  // the Success it was sent, digest included
  }
  st.peer_incarnation = incarnation_of(d);
  (void)core_.send(*peer, st);
  log_event(LogLevel::kDebug, kComp, fmt::format("{} asked again: {} status sent again", d.str(), to_string(st.state)),
            room_fields(r.room));
}

void PrefillEndpoint::add_failed_room(uint64_t room, const Failure& f, bool observed_here) {
  std::vector<std::pair<int64_t, RoomMetadata>> kept;
  if (!rooms_.count(room)) {
    kept = take_pending_meta(room);
    (void)add_room(room, core_.layout().page_size, std::nullopt);  // one page's tokens: never sent
  }
  fail(room, f, observed_here);
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return;
  for (auto& [ns, md] : kept) apply_metadata(it->second, md);
}

void PrefillEndpoint::apply_metadata(SenderRoom& r, const RoomMetadata& md) {
  if (r.planned && r.engine && *r.engine != md.sender.engine_id) {  // another instance's: refused
    (void)from_destination("metadata", r.room, md.sender);
    return;
  }
  // The first metadata accepted binds the room to its instance (a destination of it down, or
  // refused as incompatible, fails the room, as add_room does; the metadata is answered below).
  if (r.planned && !r.engine) (void)bind(r, md.sender.engine_id);
  // The same destination again: it asks for the status it is owed (decode_reask.cc). The first
  // metadata stays; nothing of the repeat is stored.
  if (r.meta.count(md.sender)) return answer_again(r, md.sender);
  if (r.state.get() == KVPoll::Failed) {
    // The room failed before this destination's metadata arrived (e.g. a failure on this rank
    // when the room was created): our failure status may have reached the decode rank before it
    // knew the room, so answer the metadata with the cause, as for a released room.
    const std::string* peer = control_endpoint_of(md.sender);
    auto e = core_.registry().get(r.room);
    if (peer && e) {
      RoomStatus st{r.room, core_.self(), KVPoll::Failed, e->failure()};
      st.peer_incarnation = incarnation_of(md.sender);
      (void)core_.send(*peer, st);
    }
    log_event(LogLevel::kDebug, kComp, "metadata for a failed room answered with its failure", room_fields(r.room));
    return;
  }
  if (r.state.terminal()) return;
  const PoolRegistration* reg = registration_for(md.sender);
  bool expected = false;
  for (const RankId& d : r.dests) expected |= (d == md.sender);
  std::string bad;
  if (auto refused = refused_.find(md.sender); expected && reg == nullptr && refused != refused_.end()) {
    // Its registration was refused (logged once, and told to it): the room fails with that
    // record, as the decode rank's rooms do, so both engines name the one root cause.
    fail(r.room, refused->second, /*observed_here=*/false, &md.sender);
    return;
  }
  if (!expected) bad = fmt::format("metadata from {} which is not a destination of this rank", md.sender.str());
  else if (reg == nullptr) bad = fmt::format("metadata from {} before its pool registration", md.sender.str());
  else if (md.kv_indices.size() != r.total_pages)
    bad = fmt::format("{} kv_indices for a room of {} pages", md.kv_indices.size(), r.total_pages);
  else if (md.aux_index >= reg->aux_rows)
    bad = fmt::format("aux index {} out of range ({} rows)", md.aux_index, reg->aux_rows);
  else if (!md.state_indices.empty() && reg->state_offsets.empty())
    bad = fmt::format("{} state indices for a rank without state buffers", md.state_indices.size());
  else {
    for (uint64_t s : md.state_indices) {
      if (s >= reg->state_rows) {
        bad = fmt::format("state index {} out of range ({} rows)", s, reg->state_rows);
        break;
      }
    }
  }
  if (bad.empty()) {
    for (uint64_t p : md.kv_indices) {
      if (p >= reg->num_pages) {
        bad = fmt::format("page index {} out of range ({} pages)", p, reg->num_pages);
        break;
      }
    }
  }
  if (!bad.empty()) {
    fail(r.room, ErrorCode::kProtocolError, "bad room metadata: " + bad, core_.self(), monotonic_ns(), true);
    return;
  }
  if (core_.config().integrity && !md.integrity) {  // both sides must verify (docs/manager.md)
    fail(r.room, ErrorCode::kIntegrityError,
         fmt::format("{} did not ask for the room's integrity digest, and this rank requires integrity "
                     "(integrity is on here, off there)", md.sender.str()),
         core_.self(), monotonic_ns(), true);
    return;
  }
  r.meta[md.sender] = md;
  maybe_ready(r);
}

void PrefillEndpoint::maybe_ready(SenderRoom& r) {
  if (r.state.get() != KVPoll::Bootstrapping || (r.planned && !r.engine) || r.meta.size() != r.dests.size()) return;
  for (const RankId& d : r.dests)
    if (!peers_.count(d) || connecting_.count(d)) return;  // not ready (a state): its connect is under way
  r.state.advance(KVPoll::WaitingForInput);
  log_event(LogLevel::kDebug, kComp, "metadata complete", room_fields(r.room));
}

void PrefillEndpoint::leaving(std::set<uint64_t> coming) {
  self_leaving_ = true;
  coming_ = std::move(coming);
  std::vector<uint64_t> held;
  for (const auto& [room, list] : pending_meta_)
    if (!coming_.count(room)) held.push_back(room);
  for (uint64_t room : held)
    for (const auto& [ns, md] : take_pending_meta(room)) answer_leaving(md);
}

// A leaving rank's answer to metadata for a room it has no sender for (the router sent the
// request to an instance being drained): the room fails at decode at once, with this rank as its
// origin and a reason that says so, instead of waiting for this rank's heartbeats to stop.
void PrefillEndpoint::answer_leaving(const RoomMetadata& md) {
  answer_refused_metadata(md, ErrorCode::kAborted,
                          "this prefill rank is leaving (Manager::leave()): it takes no new rooms", leaving_line_ns_);
}

}  // namespace kvferry
