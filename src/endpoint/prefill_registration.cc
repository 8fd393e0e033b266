// PrefillEndpoint's side of the pool registrations (prefill_endpoint.h): what a decode rank
// declares about its memory, checked against this rank's shape and transfer plan before use, and
// the transport connection to it; the incarnation every frame from a decode rank is checked
// against (kvferry/messages.h) before on_message() hands it on.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "endpoint/prefill_endpoint.h"
#include "endpoint/room_list.h"
#include "endpoint/span_compat.h"
#include "kvferry/log.h"
#include "kvferry/routing.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.endpoint";
}  // namespace

// The same decode memory, reached the same way: a registration repeated by the same process
// (every field alike, incarnations included: the wire form of both is the same).
// The same registration, whatever incarnation of this rank it was addressed to (a decode rank
// given another one by the bootstrap service registers again with this one: attack 2d).
static bool same_pool(const PoolRegistration& a, const PoolRegistration& b) {
  PoolRegistration x = a, y = b;
  x.peer_incarnation = y.peer_incarnation = 0;
  return encode(Message{x}) == encode(Message{y});
}

MemoryShape shape_of(const PoolRegistration& r) {
  MemoryShape s;
  s.page_size = r.page_size;
  s.page_bytes = r.page_bytes;
  s.num_pages = r.num_pages;
  s.kv_offsets = r.kv_offsets;
  s.aux_offsets = r.aux_offsets;
  s.aux_item_bytes = r.aux_item_bytes;
  s.aux_rows = r.aux_rows;
  s.state_offsets = r.state_offsets;
  s.state_item_bytes = r.state_item_bytes;
  s.state_rows = r.state_rows;
  s.guard_offset = r.guard_offset;
  return s;
}

std::string PrefillEndpoint::check_registration(const PoolRegistration& r) const {
  const PoolLayout& l = core_.layout();
  const MemoryShape& ours = core_.shape();
  if (r.sender.role != Role::kDecode) return "sender is not a decode rank";
  if (r.page_size != l.page_size) return fmt::format("page_size {} != ours {}", r.page_size, l.page_size);
  if (r.kv_offsets.size() != ours.kv_offsets.size())
    return fmt::format("{} KV buffers != our {}", r.kv_offsets.size(), ours.kv_offsets.size());
  if (r.aux_item_bytes != ours.aux_item_bytes)
    return fmt::format("aux buffers of [{}] bytes a row != ours [{}]", fmt::join(r.aux_item_bytes, ", "),
                       fmt::join(ours.aux_item_bytes, ", "));
  if (r.state_item_bytes != ours.state_item_bytes)
    return fmt::format("state buffers of [{}] bytes a row != ours [{}]", fmt::join(r.state_item_bytes, ", "),
                       fmt::join(ours.state_item_bytes, ", "));
  const uint32_t model_heads = l.model.is_mla() ? 1 : l.model.cache_heads;
  if (r.heads_per_rank == 0 || r.first_head > model_heads || r.heads_per_rank > model_heads - r.first_head)
    return fmt::format("heads [{}, +{}) outside the model's {} KV heads", r.first_head, r.heads_per_rank, model_heads);
  uint64_t expected = 0;
  const uint64_t head_bytes = uint64_t(l.model.head_dim) * l.model.dtype_bytes;
  if (__builtin_mul_overflow(uint64_t(r.page_size) * r.heads_per_rank, head_bytes, &expected) ||
      r.page_bytes != expected)
    return fmt::format("page_bytes {} is not {} tokens x {} heads of {} bytes", r.page_bytes, r.page_size,
                       r.heads_per_rank, head_bytes);
  for (const HeadTransfer& t : plan_) {
    if (t.prefill_rank != core_.self().tp_rank || t.decode_rank != r.sender.tp_rank) continue;
    if (t.first_head < r.first_head || t.first_head + t.num_heads > r.first_head + r.heads_per_rank)
      return fmt::format("heads [{}, +{}) do not hold heads [{}, +{}) the transfer plan sends it", r.first_head,
                         r.heads_per_rank, t.first_head, t.num_heads);
  }
  std::vector<SpanExtent> spans;
  for (const RegionSpan& sp : r.spans) spans.push_back({sp.offset, sp.bytes});
  return check_shape_in_spans(shape_of(r), spans);
}

bool PrefillEndpoint::in_plan(const RankId& r) const {
  // Any engine_id: each decode instance is one (prefill_instances.cc).
  if (r.role != Role::kDecode || r.dp_rank >= decode_dp_) return false;
  for (uint32_t d : dests_of(plan_, core_.self().tp_rank))
    if (d == r.tp_rank) return true;
  return false;
}

bool PrefillEndpoint::admits(const RankId& sender) {
  if (in_plan(sender)) return true;
  core_.refuse(Refusal::kOutsidePlan, sender,
               fmt::format("frame from {} refused: not a destination of {} in the transfer plan", sender.str(),
                           core_.self().str()));
  return false;
}

void PrefillEndpoint::on_message(const Message& m) {
  int64_t now = monotonic_ns();
  if (!admits(std::visit([](const auto& x) { return x.sender; }, m))) return;  // before anything else
  if (auto* hb = std::get_if<Heartbeat>(&m)) {
    if (hb->answer != 0) return on_challenge_answer(*hb);  // may name the claimed incarnation
    if (!accept_incarnation(hb->sender, hb->incarnation, 0, "Heartbeat")) return;
    core_.monitor().heard(hb->sender, now);
    touch_instance(hb->sender, now);
    // An orderly shutdown of that decode rank (messages.h Heartbeat::leaving): its loss, when
    // reported, is quiet if no room failed with it; nothing is cut off on its word, and its next
    // heartbeat revokes it (decode_peer_loss.cc says why).
    if (!hb->leaving) leaving_.erase(hb->sender);
    else if (peers_.count(hb->sender)) leaving_.insert(hb->sender);
    if (hb->leaving) return;
    if (hb->challenge != 0) answer_challenge(*hb);
    if (!hb->renew_rooms.empty()) on_renewal(*hb, now);
    return;
  }
  if (auto* r = std::get_if<PoolRegistration>(&m)) return on_registration(*r);
  if (auto* md = std::get_if<RoomMetadata>(&m)) {
    if (!accept_incarnation(md->sender, md->incarnation, md->peer_incarnation, "RoomMetadata")) return;
    core_.monitor().heard(md->sender, now);
    touch_instance(md->sender, now);
    return on_metadata(*md);
  }
  if (auto* st = std::get_if<RoomStatus>(&m)) {
    if (!accept_incarnation(st->sender, st->incarnation, st->peer_incarnation, "RoomStatus")) return;
    core_.monitor().heard(st->sender, now);
    touch_instance(st->sender, now);
    return on_status(*st);
  }
}

uint64_t PrefillEndpoint::known_incarnation(const RankId& peer) const {
  auto it = incarnations_.find(peer);
  return it == incarnations_.end() ? 0 : it->second;
}

// Frames other than registrations (docs/security.md, "Incarnations"): from the incarnation that
// connected (or whose restart was confirmed), or from the one connecting now. An older one is
// stale; a newer one is not believed (a restart is believed from a registration only): refused,
// nothing changed.
bool PrefillEndpoint::accept_incarnation(const RankId& sender, uint64_t inc, uint64_t peer_inc,
                                         std::string_view kind) {
  if (peer_inc != 0 && peer_inc != core_.incarnation()) {
    core_.refuse_stale(kind, sender,
                       fmt::format("meant for incarnation {} of this rank, which is {}", peer_inc, core_.incarnation()));
    return false;
  }
  const uint64_t known = known_incarnation(sender);
  auto c = connecting_.find(sender);
  const uint64_t connecting = c == connecting_.end() ? 0 : c->second.reg.incarnation;
  // inc 0: built in this process (the codec refuses 0 on the wire), e.g. by a test.
  if (inc == 0 || inc == known || inc == connecting || (known == 0 && connecting == 0)) return true;
  if (inc < std::max(known, connecting)) {
    core_.refuse_stale(kind, sender, fmt::format("from its incarnation {}, older than {}", inc, std::max(known, connecting)));
    return false;
  }
  core_.refuse(Refusal::kUnconfirmedRestart, sender,
               fmt::format("{} from {} refused: incarnation {} is newer than the one registered ({}); a restart is "
                           "believed from a pool registration only",
                           kind, sender.str(), inc, std::max(known, connecting)),
               // A plausible incarnation: a restart whose registration is under way (debug only).
               /*quiet=*/inc <= static_cast<uint64_t>(realtime_ns()) + kMaxIncarnationSkewNs);
  return false;
}

const PoolRegistration* PrefillEndpoint::registration_under(const RankId& peer, uint64_t inc) const {
  if (auto c = connecting_.find(peer); c != connecting_.end() && c->second.reg.incarnation == inc) return &c->second.reg;
  if (auto p = peers_.find(peer); p != peers_.end() && p->second.reg.incarnation == inc) return &p->second.reg;
  if (auto d = dead_regs_.find(peer); d != dead_regs_.end() && d->second.incarnation == inc) return &d->second;
  return nullptr;
}

bool PrefillEndpoint::accept_registration(const PoolRegistration& r, bool* restart) {
  *restart = false;
  // Meant for an incarnation of this rank newer than this one: no later process of this rank lives
  // (a decode rank was given a bootstrap entry stamped ahead, attack 2d). Taken as meant for this
  // one; the decode rank learns this incarnation from this rank's answer to its challenge.
  if (r.peer_incarnation > core_.incarnation()) {
    core_.peer_debug(kComp, fmt::format("pool registration of {} names incarnation {} of this rank, which is {}: taken as "
                                 "meant for this one",
                                 r.sender.str(), r.peer_incarnation, core_.incarnation()));
  } else if (r.peer_incarnation != 0 && r.peer_incarnation != core_.incarnation()) {
    core_.refuse_stale("PoolRegistration", r.sender,
                       fmt::format("meant for incarnation {} of this rank, which is {}", r.peer_incarnation,
                                   core_.incarnation()));
    // Meant for this rank's previous incarnation: a heartbeat tells the decode rank at once who
    // answers here now (it then registers again), as a refusal is answered (may_answer()).
    if (may_answer(r)) (void)core_.send(r.control_endpoint, Heartbeat{core_.self(), 0, monotonic_ns(), core_.incarnation()});
    return false;
  }
  const int64_t now_wall = realtime_ns();
  if (r.incarnation != 0 && r.incarnation > static_cast<uint64_t>(now_wall) + kMaxIncarnationSkewNs) {
    core_.refuse(Refusal::kFutureIncarnation, r.sender,
                 fmt::format("pool registration of {} refused: incarnation {} is more than {} s ahead of this "
                             "rank's clock ({})",
                             r.sender.str(), r.incarnation, kMaxIncarnationSkewNs / 1'000'000'000, now_wall));
    return false;
  }
  if (r.incarnation == 0) return true;  // built in this process (tests)
  const uint64_t known = known_incarnation(r.sender);
  if (known != 0 && r.incarnation < known) {
    core_.refuse_stale("PoolRegistration", r.sender, fmt::format("from its incarnation {}, older than {}", r.incarnation, known));
    return false;
  }
  // Within one incarnation a registration cannot change (the same process registers one pool).
  if (const PoolRegistration* same = registration_under(r.sender, r.incarnation); same && !same_pool(*same, r)) {
    core_.refuse(Refusal::kChangedRegistration, r.sender,
                 fmt::format("pool registration of {} refused: incarnation {} registered a different pool already",
                             r.sender.str(), r.incarnation));
    return false;
  }
  if (known == 0 || r.incarnation == known) return true;
  // A restart claim: believed once confirmed at the old incarnation's endpoint (prefill_restarts.cc).
  const PoolRegistration* old = registration_for(r.sender);
  if (!old) old = dead_regs_.count(r.sender) ? &dead_regs_.at(r.sender) : nullptr;
  if (old && !restart_confirmed(r, *old)) {
    // A claim this rank could not serve is never held: held, it would stand in for a real restart
    // whose incarnation is older (attack 2a: claims stamped now + 59 s with a pool of the wrong shape).
    if (std::string bad = check_registration(r); !bad.empty()) {
      core_.refuse(Refusal::kBadRegistration, r.sender,
                   fmt::format("restart claim of {} as incarnation {} refused: {}", r.sender.str(), r.incarnation, bad));
      return false;
    }
    const std::string old_endpoint = old->control_endpoint;
    hold_restart_claim(r, old_endpoint, monotonic_ns());
    core_.refuse(Refusal::kUnconfirmedRestart, r.sender,
                 fmt::format("pool registration of {} as incarnation {} held until {} answers a challenge: "
                             "incarnation {} registered there",
                             r.sender.str(), r.incarnation, old_endpoint, known),
                 /*quiet=*/true);
    return false;
  }
  *restart = true;
  return true;
}

void PrefillEndpoint::on_peer_restart(const RankId& peer, uint64_t inc) {
  const uint64_t old = known_incarnation(peer);
  core_.count_peer_restart();
  incarnations_[peer] = inc;
  pending_restarts_.erase(peer);
  verified_owners_.erase(peer);
  revivals_.forget(peer);
  if (peers_.count(peer)) on_peer_dead(peer, fmt::format("restarted (incarnation {} -> {})", old, inc));
  dead_regs_.erase(peer);  // never reconnect to the previous incarnation
}

void PrefillEndpoint::on_registration(const PoolRegistration& r) {
  if (r.sender.role == Role::kDecode && !admit_instance(r, monotonic_ns())) return;  // nothing kept
  if (!incarnations_.count(r.sender) && !connecting_.count(r.sender) && !dead_regs_.count(r.sender) &&
      incarnations_.size() + connecting_.size() + dead_regs_.size() >= kMaxPeerIdentities) {
    core_.refuse(Refusal::kTooManyPeers, r.sender,
                 fmt::format("pool registration of {} refused: {} decode ranks known already", r.sender.str(),
                             kMaxPeerIdentities));
    return;
  }
  bool restart = false;
  if (!accept_registration(r, &restart)) return;
  std::string bad = check_registration(r);
  std::optional<RemoteRegionInfo> info;
  if (bad.empty()) {
    auto ri = region_info(r.worker_address, r.spans);
    if (ri.ok()) info = std::move(ri).value();
    else bad = ri.status().message();
  }
  if (!bad.empty()) {
    ++refused_registrations_;
    last_refusal_ = bad;
    core_.refuse(Refusal::kBadRegistration, r.sender,
                 fmt::format("rejected pool registration from {}: {}", r.sender.str(), bad));
    refuse(r, bad);
    return;
  }
  instances_.try_emplace(r.sender.engine_id, DecodeInstance{monotonic_ns()});  // under the bound (admit_instance)
  if (restart) on_peer_restart(r.sender, r.incarnation);  // confirmed: the old one is gone
  refused_.erase(r.sender);
  auto old = peers_.find(r.sender);
  if (old != peers_.end() && !connecting_.count(r.sender) && same_pool(old->second.reg, r)) {
    // The same process registers the same pool again (it had taken our silence for a death and
    // heard us again): the connection is kept. Replacing it would fail the writes in flight on
    // it, and a write failed here may still land there (it left this rank already), after its
    // room drained and its pages went to another room.
    dead_peers_.erase(r.sender);
    left_.erase(r.sender);
    core_.monitor().watch(r.sender, r.control_endpoint);
    log_event(LogLevel::kDebug, kComp, fmt::format("decode peer {} registered again, unchanged: connection kept", r.sender.str()));
    for (auto& [id, room] : rooms_) maybe_ready(room);
    return;
  }
  if (auto c = connecting_.find(r.sender); c != connecting_.end() && same_pool(c->second.reg, r)) return;  // under way
  start_connect(r, std::move(*info));
}

void PrefillEndpoint::start_connect(const PoolRegistration& r, RemoteRegionInfo info) {
  const uint64_t id = next_connect_id_++;
  if (!core_.connector().start(id, std::move(info))) {
    log_event(LogLevel::kWarning, kComp,
              fmt::format("registration of {} dropped: {} transport connects under way already", r.sender.str(),
                          Connector::kMaxInFlight),
              {.code = std::string(code_name(ErrorCode::kResourceExhausted)), .origin = core_.self().str()});
    return;
  }
  // A newer registration supersedes a connect under way (its result is disconnected on arrival).
  connecting_[r.sender] = {r, id, monotonic_ns() + core_.config().deadlines.connect_timeout_ms * 1'000'000};
  // A working peer stays as it is until the new connect completes (check_connects()).
  if (!peers_.count(r.sender)) dead_peers_.erase(r.sender);  // its rooms wait for the connect
  left_.erase(r.sender);  // registering again: back
  log_event(LogLevel::kDebug, kComp, fmt::format("decode peer {} registering: transport connect started", r.sender.str()));
}

const PoolRegistration* PrefillEndpoint::registration_for(const RankId& d) const {
  if (auto c = connecting_.find(d); c != connecting_.end()) return &c->second.reg;
  if (auto p = peers_.find(d); p != peers_.end()) return &p->second.reg;
  return nullptr;
}

const std::string* PrefillEndpoint::control_endpoint_of(const RankId& d) const {
  if (const PoolRegistration* r = registration_for(d)) return &r->control_endpoint;
  if (auto it = dead_regs_.find(d); it != dead_regs_.end()) return &it->second.control_endpoint;
  return nullptr;
}

void PrefillEndpoint::check_connects(int64_t now_ns) {
  for (Connector::Done& done : core_.connector().take_done()) {
    auto it = connecting_.begin();
    while (it != connecting_.end() && it->second.id != done.id) ++it;
    if (it == connecting_.end()) {  // superseded, or its deadline passed: not wanted any more
      if (done.peer.ok()) core_.transport().disconnect(*done.peer);
      continue;
    }
    const RankId sender = it->first;
    const PoolRegistration reg = std::move(it->second.reg);
    connecting_.erase(it);
    if (!done.peer.ok()) {
      connect_failed(sender, reg, done.peer.status().str());
      continue;
    }
    if (auto old = peers_.find(sender); old != peers_.end()) {  // replaced only now that the new one works
      core_.transport().disconnect(old->second.peer);
      if (old->second.reg.control_endpoint != reg.control_endpoint) core_.control().forget(old->second.reg.control_endpoint);
    }
    peers_[sender] = {reg, shape_of(reg), *done.peer};
    if (reg.incarnation != 0) incarnations_[sender] = std::max(known_incarnation(sender), reg.incarnation);
    if (auto p = pending_restarts_.find(sender); p != pending_restarts_.end() && p->second.reg.incarnation <= reg.incarnation)
      pending_restarts_.erase(p);
    dead_peers_.erase(sender);
    left_.erase(sender);
    dead_regs_.erase(sender);
    core_.monitor().watch(sender, reg.control_endpoint);
    log_event(LogLevel::kDebug, kComp, fmt::format("decode peer {} registered ({} pages)", sender.str(), reg.num_pages));
    for (auto& [id, r] : rooms_) maybe_ready(r);
  }
  std::vector<RankId> late;
  for (const auto& [rank, c] : connecting_)
    if (now_ns > c.deadline_ns) late.push_back(rank);
  for (const RankId& rank : late) {
    const PoolRegistration reg = std::move(connecting_.at(rank).reg);
    connecting_.erase(rank);
    connect_failed(rank, reg,
                   fmt::format("transport connect did not complete within {} ms",
                               core_.config().deadlines.connect_timeout_ms));
  }
}

void PrefillEndpoint::connect_failed(const RankId& peer, const PoolRegistration& reg, const std::string& why) {
  const int64_t now = monotonic_ns();
  if (auto working = peers_.find(peer); working != peers_.end() && !dead_peers_.count(peer)) {
    // A registration that failed to connect never replaces one that works: the peer goes on.
    log_event(LogLevel::kWarning, kComp,
              fmt::format("cannot connect to decode peer {} with its new registration: {}; the working connection "
                          "is kept",
                          peer.str(), why),
              {.code = std::string(code_name(ErrorCode::kPeerUnreachable)), .origin = peer.str(),
               .extra = {{"peer", peer.str()}, {"event", "connect_failed_kept"}}});
    return;
  }
  // The same registration failing again (a retry once it answered again) is logged at debug.
  auto before = dead_regs_.find(peer);
  const bool again = before != dead_regs_.end() && before->second.worker_address == reg.worker_address;
  // The registration to reconnect with once it answers again: one that worked stays (a failed
  // one of the same incarnation never replaces it; a confirmed restart erased it).
  if (before == dead_regs_.end() || known_incarnation(peer) == 0 || before->second.incarnation != known_incarnation(peer))
    dead_regs_[peer] = reg;  // first: the rooms' failures below are told to it there
  std::vector<uint64_t> failed;
  for (auto& [id, r] : rooms_) {
    if (r.state.terminal()) continue;
    const std::vector<RankId> dests = dests_or_presumed(r);
    if (std::find(dests.begin(), dests.end(), peer) == dests.end()) continue;
    fail(id, ErrorCode::kPeerUnreachable, fmt::format("cannot connect to {}: {}", peer.str(), why), peer, now, false);
    failed.push_back(id);
  }
  // The manager's senders not init()ed yet that are bound for it fail too, named below.
  if (unopened_hook_)
    for (uint64_t id : unopened_hook_(peer, fmt::format("cannot connect to {}: {}", peer.str(), why), now))
      failed.push_back(id);
  std::sort(failed.begin(), failed.end());
  const bool left = leaving_.erase(peer) > 0;  // it said it was leaving (docs/failure-model.md, "Leaving")
  log_event(again && failed.empty() ? LogLevel::kDebug : left && failed.empty() ? LogLevel::kInfo : LogLevel::kWarning,
            kComp,
            fmt::format("cannot connect to decode peer {}: {}; {} failed: {}", peer.str(), why,
                        failed.size() == 1 ? "1 room" : fmt::format("{} rooms", failed.size()), room_list(failed)),
            {.code = std::string(code_name(ErrorCode::kPeerUnreachable)), .origin = peer.str(),
             .extra = {{"peer", peer.str()}, {"event", "connect_failed"}}});
  if (auto old = peers_.find(peer); old != peers_.end()) {  // its previous incarnation's endpoint
    core_.transport().disconnect(old->second.peer);
    peers_.erase(old);
  }
  // As a dead peer: rooms for it fail at once; it is connected again once it answers again.
  core_.monitor().watch(peer, reg.control_endpoint);
  core_.monitor().mark_dead(peer);
  dead_peers_.insert(peer);
}

bool PrefillEndpoint::may_answer(const PoolRegistration& r) {
  const std::string* known = control_endpoint_of(r.sender);
  const bool existing = known && *known == r.control_endpoint && core_.control().connected_to(*known);
  // Not answered: counted as refused already (a line per frame would let a peer fill the log).
  if (!existing && (known || told_refusal_.count(r.sender))) return false;
  if (!refusal_answers_.take(monotonic_ns())) return false;
  if (!existing) told_refusal_.insert(r.sender);
  return true;
}

bool PrefillEndpoint::admits_compat(std::string_view frame) {
  std::optional<Result<Compat>> theirs = frame_compat(frame);
  if (!theirs || !theirs->ok()) return true;  // no registration, or decode() refuses it as malformed
  std::optional<CompatMismatch> mm = compat_mismatch(core_.compat(), theirs->value());
  if (!mm) return true;
  // Decoded by kvferry's own bounded parser only to address the refusal: nothing else of it is
  // used, no memory key of it reaches the transport.
  auto msg = kvferry::decode(frame, 0);
  if (!msg.ok() || !std::holds_alternative<PoolRegistration>(*msg)) return true;  // refused as malformed
  const PoolRegistration& r = std::get<PoolRegistration>(*msg);
  const std::string why = fmt::format("incompatible: {}", mm->str());
  const uint64_t known = known_incarnation(r.sender);
  const bool stale = r.incarnation != 0 && known != 0 && r.incarnation < known;
  const bool future = r.incarnation > static_cast<uint64_t>(realtime_ns()) + kMaxIncarnationSkewNs;
  if (registration_for(r.sender) != nullptr || stale || future) {
    // That rank has a registration in use here, or the frame's incarnation is older than one it
    // registered or beyond the clock skew allowed: a frame in its name that does not match is not
    // believed (anyone who reaches the port may send one without the secret); counted, at debug,
    // and nothing changes. A restarted rank's old registration ends with its death first.
    core_.refuse(Refusal::kIncompatible, r.sender,
                 fmt::format("pool registration of {} (incarnation {}) not believed: {}", r.sender.str(),
                             r.incarnation, why),
                 /*quiet=*/true);
    return false;
  }
  core_.refuse(Refusal::kIncompatible, r.sender, fmt::format("pool registration of {} refused: {}", r.sender.str(), why),
               /*quiet=*/true);
  if (core_.first_incompatible(r.sender, r.incarnation, monotonic_ns()))
    log_event(LogLevel::kError, kComp,
              fmt::format("decode peer {} is incompatible with {}: {} (ours, then the peer's); its pool registration "
                          "is refused and its rooms fail with incompatible_peer",
                          r.sender.str(), core_.self().str(), mm->str()),
              {.code = std::string(code_name(ErrorCode::kIncompatiblePeer)), .origin = core_.self().str(),
               .extra = {{"peer", r.sender.str()}, {"event", "incompatible_peer"}, {"field", mm->field}}});
  refuse(r, why, ErrorCode::kIncompatiblePeer);
  if (r.sender.role != Role::kDecode) return false;
  ++incompatible_refusals_;
  const Failure f = refused_.at(r.sender);
  std::vector<uint64_t> bound;
  for (auto& [id, room] : rooms_) {
    if (room.state.terminal()) continue;
    for (const RankId& d : dests_or_presumed(room))
      if (d == r.sender) bound.push_back(id);
  }
  for (uint64_t id : bound) fail(id, f, /*observed_here=*/false, &r.sender);
  return false;
}

bool PrefillEndpoint::fail_if_incompatible(uint64_t room) {
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return false;
  for (const RankId& d : dests_or_presumed(it->second)) {
    auto rf = refused_.find(d);
    if (rf == refused_.end() || rf->second.code != ErrorCode::kIncompatiblePeer) continue;
    const Failure f = rf->second;
    fail(room, f, /*observed_here=*/false, &d);
    return true;
  }
  return false;
}

std::optional<Failure> PrefillEndpoint::incompatible_destination(uint64_t room) const {
  for (const RankId& d : destinations(room)) {
    auto rf = refused_.find(d);
    if (rf != refused_.end() && rf->second.code == ErrorCode::kIncompatiblePeer) return rf->second;
  }
  return std::nullopt;
}

void PrefillEndpoint::refuse(const PoolRegistration& r, const std::string& why, ErrorCode code) {
  if (r.sender.role != Role::kDecode) return;  // not a decode rank: no rooms of it to fail
  const int64_t now = monotonic_ns();
  Failure f{code, core_.self(),
            fmt::format("pool registration of {} refused by {}: {}", r.sender.str(), core_.self().str(), why), now,
            wall_from_monotonic(now)};
  if (!refused_.count(r.sender) && refused_.size() >= kMaxRefused) refused_.erase(refused_.begin());
  refused_[r.sender] = f;
  RegistrationRefusal refusal{core_.self(), f};
  refusal.peer_incarnation = r.incarnation;  // meant for the incarnation that registered
  if (!may_answer(r)) return;
  Status s = core_.send(r.control_endpoint, refusal);
  if (!s.ok()) log_event(LogLevel::kDebug, kComp, "refusal not delivered to " + r.sender.str() + ": " + s.str());
}

}  // namespace kvferry
