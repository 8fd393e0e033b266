// PrefillEndpoint's side of the pool registrations (prefill_endpoint.h): what a decode rank
// declares about its memory, checked against this rank's shape and transfer plan before use, and
// the transport connection to it; the incarnation every frame from a decode rank is checked
// against (kvferry/messages.h) before on_message() hands it on.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "endpoint/prefill_endpoint.h"
#include "endpoint/span_compat.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.endpoint";
}  // namespace

// The same decode memory, reached the same way: a registration repeated by the same process
// (every field alike, incarnations included: the wire form of both is the same).
static bool same_pool(const PoolRegistration& a, const PoolRegistration& b) { return encode(Message{a}) == encode(Message{b}); }

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

void PrefillEndpoint::on_message(const Message& m) {
  int64_t now = monotonic_ns();
  if (auto* hb = std::get_if<Heartbeat>(&m)) {
    if (accept_incarnation(hb->sender, hb->incarnation, 0, "Heartbeat")) core_.monitor().heard(hb->sender, now);
    return;
  }
  if (auto* r = std::get_if<PoolRegistration>(&m)) return on_registration(*r);
  if (auto* md = std::get_if<RoomMetadata>(&m)) {
    if (!accept_incarnation(md->sender, md->incarnation, md->peer_incarnation, "RoomMetadata")) return;
    core_.monitor().heard(md->sender, now);
    return on_metadata(*md);
  }
  if (auto* st = std::get_if<RoomStatus>(&m)) {
    if (!accept_incarnation(st->sender, st->incarnation, st->peer_incarnation, "RoomStatus")) return;
    core_.monitor().heard(st->sender, now);
    return on_status(*st);
  }
}

uint64_t PrefillEndpoint::known_incarnation(const RankId& peer) const {
  auto it = incarnations_.find(peer);
  return it == incarnations_.end() ? 0 : it->second;
}

bool PrefillEndpoint::accept_incarnation(const RankId& sender, uint64_t inc, uint64_t peer_inc,
                                         std::string_view kind) {
  if (peer_inc != 0 && peer_inc != core_.incarnation()) {
    core_.refuse_stale(kind, sender,
                       fmt::format("meant for incarnation {} of this rank, which is {}", peer_inc, core_.incarnation()));
    return false;
  }
  const uint64_t known = known_incarnation(sender);
  // inc 0: built in this process (the codec refuses 0 on the wire), e.g. by a test.
  if (known == 0 || inc == 0 || inc == known) return true;
  if (inc < known) {
    core_.refuse_stale(kind, sender, fmt::format("from its incarnation {}, older than {}", inc, known));
    return false;
  }
  on_peer_restart(sender, inc);
  return kind == "PoolRegistration";
}

void PrefillEndpoint::on_peer_restart(const RankId& peer, uint64_t inc) {
  const uint64_t old = known_incarnation(peer);
  core_.count_peer_restart();
  incarnations_[peer] = inc;
  if (peers_.count(peer)) on_peer_dead(peer, fmt::format("restarted (incarnation {} -> {})", old, inc));
  dead_regs_.erase(peer);  // never reconnect to the previous incarnation
}

void PrefillEndpoint::on_registration(const PoolRegistration& r) {
  if (!accept_incarnation(r.sender, r.incarnation, r.peer_incarnation, "PoolRegistration")) {
    if (r.peer_incarnation != 0 && r.peer_incarnation != core_.incarnation()) {
      // Meant for this rank's previous incarnation: a heartbeat tells the decode rank at once who
      // answers here now (it then fails what it had with that one and registers again).
      (void)core_.send(r.control_endpoint, Heartbeat{core_.self(), 0, monotonic_ns(), core_.incarnation()});
    }
    return;
  }
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
    log_event(LogLevel::kWarning, kComp,
              fmt::format("rejected pool registration from {}: {}", r.sender.str(), bad),
              {.code = std::string(code_name(ErrorCode::kProtocolError)), .origin = r.sender.str()});
    refuse(r, bad);
    return;
  }
  refused_.erase(r.sender);
  auto old = peers_.find(r.sender);
  if (old != peers_.end() && !connecting_.count(r.sender) && same_pool(old->second.reg, r)) {
    // The same process registers the same pool again (it had taken our silence for a death and
    // heard us again): the connection is kept. Replacing it would fail the writes in flight on
    // it, and a write failed here may still land there (it left this rank already), after its
    // room drained and its pages went to another room.
    dead_peers_.erase(r.sender);
    core_.monitor().watch(r.sender, r.control_endpoint);
    log_event(LogLevel::kDebug, kComp, fmt::format("decode peer {} registered again, unchanged: connection kept", r.sender.str()));
    for (auto& [id, room] : rooms_) maybe_ready(room);
    return;
  }
  if (old != peers_.end()) core_.control().forget(old->second.reg.control_endpoint);  // a restarted decode rank
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
  incarnations_[r.sender] = r.incarnation;  // the newest that registered (accept_incarnation())
  dead_peers_.erase(r.sender);  // it is back: its rooms wait for the connect (connect_failed: down again)
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
    if (auto old = peers_.find(sender); old != peers_.end()) core_.transport().disconnect(old->second.peer);
    peers_[sender] = {reg, shape_of(reg), *done.peer};
    dead_peers_.erase(sender);
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
  // The same registration failing again (a retry once it answered again) is logged at debug.
  auto before = dead_regs_.find(peer);
  const bool again = before != dead_regs_.end() && before->second.worker_address == reg.worker_address;
  dead_regs_[peer] = reg;  // first: the rooms' failures below are told to it there
  size_t failed = 0;
  for (auto& [id, r] : rooms_) {
    if (r.state.terminal()) continue;
    if (std::find(r.dests.begin(), r.dests.end(), peer) == r.dests.end()) continue;
    fail(id, ErrorCode::kPeerUnreachable, fmt::format("cannot connect to {}: {}", peer.str(), why), peer, now, false);
    ++failed;
  }
  log_event(again && failed == 0 ? LogLevel::kDebug : LogLevel::kWarning, kComp,
            fmt::format("cannot connect to decode peer {}: {}; {} rooms failed", peer.str(), why, failed),
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

void PrefillEndpoint::refuse(const PoolRegistration& r, const std::string& why) {
  if (r.sender.role != Role::kDecode) return;  // not a decode rank: no rooms of it to fail
  const int64_t now = monotonic_ns();
  Failure f{ErrorCode::kProtocolError, core_.self(),
            fmt::format("pool registration of {} refused by {}: {}", r.sender.str(), core_.self().str(), why), now,
            wall_from_monotonic(now)};
  if (!refused_.count(r.sender) && refused_.size() >= kMaxRefused) refused_.erase(refused_.begin());
  refused_[r.sender] = f;
  RegistrationRefusal refusal{core_.self(), f};
  refusal.peer_incarnation = r.incarnation;  // meant for the incarnation that registered
  Status s = core_.send(r.control_endpoint, refusal);
  if (!s.ok()) log_event(LogLevel::kDebug, kComp, "refusal not delivered to " + r.sender.str() + ": " + s.str());
}

}  // namespace kvferry
