#include "endpoint/prefill_endpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <span>
#include <utility>

#include "endpoint/coalesce.h"
#include "endpoint/integrity.h"
#include "endpoint/room_list.h"
#include "kvferry/content.h"
#include "kvferry/log.h"
#include "kvferry/routing.h"

namespace kvferry {
namespace {
constexpr int64_t kPendingTtlNs = 120'000'000'000;  // frames for rooms not added yet
constexpr int64_t kTombstoneTtlNs = 120'000'000'000;
constexpr uint32_t kStagingAuxSlots = 4096;
constexpr std::string_view kComp = "prefill.endpoint";

LogFields room_fields(uint64_t room) {
  LogFields f;
  f.room = room;
  return f;
}
}  // namespace

PrefillEndpoint::PrefillEndpoint(EndpointCore& core, std::vector<HeadTransfer> plan, uint32_t decode_dp)
    : core_(core), plan_(std::move(plan)), decode_dp_(std::max<uint32_t>(1, decode_dp)), aux_alloc_(std::min<uint32_t>(core.layout().aux_slots, kStagingAuxSlots)) {
  const char* wrong = std::getenv("KVFERRY_TEST_WRONG_HEAD_OFFSET");
  wrong_head_offset_ = wrong && std::string(wrong) == "1";
  const char* omit = std::getenv("KVFERRY_TEST_OMIT_DIGEST");
  omit_digest_ = omit && std::string(omit) == "1";
}

const SenderRoom* PrefillEndpoint::room(uint64_t room) const {
  auto it = rooms_.find(room);
  return it == rooms_.end() ? nullptr : &it->second;
}

KVPoll PrefillEndpoint::poll(uint64_t room) const {
  auto it = rooms_.find(room);
  return it == rooms_.end() ? KVPoll::Failed : it->second.state.get();
}

bool PrefillEndpoint::metadata_complete(uint64_t room) const {
  if (pending_fail_.count(room)) return true;
  const std::vector<uint32_t> dests = dests_of(plan_, core_.self().tp_rank);
  if (dests.empty()) return true;
  auto pm = pending_meta_.find(room);
  if (pm == pending_meta_.end() || pm->second.empty()) return false;
  // The instance of the first metadata kept (bound_engine): its ranks' metadata.
  for (const RankId& want : dests_for(room, pm->second.front().second.sender.engine_id)) {
    if (!peers_.count(want) || connecting_.count(want)) return false;  // as maybe_ready: connected first
    bool found = false;
    for (const auto& [ns, md] : pm->second) found |= (md.sender == want);
    if (!found) return false;
  }
  return true;
}

std::optional<RankId> PrefillEndpoint::dead_destination(uint64_t room) const {
  if (dead_peers_.empty()) return std::nullopt;
  for (const RankId& want : destinations(room))
    if (dead_peers_.count(want)) return want;
  return std::nullopt;
}

void PrefillEndpoint::on_peer_dead(const RankId& peer, const std::string& reason) {
  auto it = peers_.find(peer);
  const bool left = leaving_.erase(peer) > 0;  // docs/failure-model.md, "Leaving"
  if (it == peers_.end()) return;
  int64_t now = monotonic_ns();
  std::vector<uint64_t> failed;
  for (auto& [id, r] : rooms_) {
    if (r.meta.count(peer)) r.failure_heard.insert(peer);  // that process answers no more
    if (r.state.terminal()) continue;
    bool bound = false;  // a room of another decode instance is not (prefill_instances.cc)
    for (const RankId& d : dests_or_presumed(r)) bound |= (d == peer);
    if (!bound) continue;
    fail(id, ErrorCode::kPeerUnreachable, fmt::format("{} unreachable: {}", peer.str(), reason), peer, now, false);
    failed.push_back(id);
  }
  // The manager's senders not init()ed yet that are bound for it fail too, named below.
  if (unopened_hook_)
    for (uint64_t id : unopened_hook_(peer, fmt::format("{} unreachable: {}", peer.str(), reason), now))
      failed.push_back(id);
  std::sort(failed.begin(), failed.end());
  if (left && failed.empty()) {
    left_.insert(peer);
    log_event(LogLevel::kInfo, kComp, fmt::format("decode peer {} left (its manager closed); no room failed", peer.str()),
              {.extra = {{"peer", peer.str()}, {"event", "peer_left"}}});
  } else {
    left_.erase(peer);
    log_event(LogLevel::kWarning, kComp,
              fmt::format("decode peer {} unreachable: {}; {} failed: {}", peer.str(), reason,
                          failed.size() == 1 ? "1 room" : fmt::format("{} rooms", failed.size()), room_list(failed)),
              {.code = std::string(code_name(ErrorCode::kPeerUnreachable)), .origin = peer.str(),
               .extra = {{"peer", peer.str()}, {"event", "peer_dead"}}});
  }
  core_.transport().disconnect(it->second.peer);
  core_.control().forget(it->second.reg.control_endpoint);
  core_.monitor().mark_dead(peer);  // keep listening: a peer that answers again is reconnected
  dead_regs_[peer] = it->second.reg;
  dead_peers_.insert(peer);
  suspect_links_.erase(peer);
  peers_.erase(it);  // last: `peer` may be this entry's key (callers iterate peers_)
}

void PrefillEndpoint::on_status(const RoomStatus& st) {
  if (st.state != KVPoll::Failed) return;  // decode only ever reports failures
  // Only a room's own destinations speak for it (docs/security.md, "Statuses bound to the room"):
  // another decode rank, or a DP group that does not serve the room, cannot fail it here.
  if (!from_destination("status", st.room, st.sender)) return;
  auto it = rooms_.find(st.room);
  if (it != rooms_.end()) {
    // Only decode's final answer (terminal) lets the room drain; an early notice stops the writes.
    if (st.terminal) it->second.failure_heard.insert(st.sender);
    fail(st.room, st.failure, false, &st.sender);
    return;
  }
  // Late news of a released room, never a new room's. Its destination's final answer is
  // answered with ours: a destination that released it unconfirmed (quarantined its pages) learns
  // here that nothing more is written (decode_quarantine.cc).
  if (tombstones_.count(st.room)) {
    if (st.terminal) (void)answer_released(st.room, st.sender);
    return;
  }
  if (unopened_failure_hook_ && unopened_failure_hook_(st.room, st.failure)) {  // a sender not init()ed
    auto opened = rooms_.find(st.room);
    if (opened != rooms_.end() && st.terminal) opened->second.failure_heard.insert(st.sender);
  } else {
    if (!pending_fail_.count(st.room) && pending_fail_.size() >= kMaxPendingRooms) return;
    pending_fail_[st.room] = {monotonic_ns(), st};
  }
  // A destination's failure of a room this rank never had (e.g. its engine failed the room while
  // this rank was out of it): nothing was written, and nothing will be (an add_room now fails at
  // once from pending_fail_, and the metadata kept is dropped), so the room is drained here: say
  // so, or the destination waits for its drain deadline and quarantines the room's pages
  // (decode_quarantine.cc).
  (void)take_pending_meta(st.room);
  if (const std::string* peer = control_endpoint_of(st.sender)) {
    RoomStatus drained{st.room, core_.self(), KVPoll::Failed, st.failure, /*terminal=*/true};
    drained.peer_incarnation = incarnation_of(st.sender);
    (void)core_.send(*peer, drained);
  }
}

Status PrefillEndpoint::add_room(uint64_t room, uint64_t input_tokens, std::optional<uint64_t> aux_index) {
  if (rooms_.count(room)) return Status::Ok();
  if (aux_index && *aux_index >= core_.shape().aux_rows)
    return {ErrorCode::kInvalidArgument,
            fmt::format("aux_index {} out of range ({} aux rows)", *aux_index, core_.shape().aux_rows)};
  tombstones_.erase(room);
  SenderRoom& r = rooms_[room];
  r.room = room;
  r.input_tokens = input_tokens;
  r.aux_index = aux_index;
  r.total_pages = core_.layout().pages_for(input_tokens);
  r.layer_pages.assign(core_.layout().model.num_layers, 0);
  r.created_ns = monotonic_ns();
  r.bootstrap_deadline_ns = r.created_ns + core_.config().deadlines.bootstrap_timeout_ms * 1'000'000;
  // Its destinations come with the instance its first metadata binds it to (bind()).
  r.planned = !dests_of(plan_, core_.self().tp_rank).empty();
  if (!r.planned) r.state.advance(KVPoll::WaitingForInput);  // nothing to wait for
  core_.registry().open(room);
  log_event(LogLevel::kDebug, kComp, fmt::format("sender created ({} pages)", r.total_pages), room_fields(room));
  for (const RankId& dst : dests_or_presumed(r)) {
    if (dead_peers_.count(dst)) {
      fail(room, ErrorCode::kPeerUnreachable, fmt::format("{} is down", dst.str()), dst, monotonic_ns(), false);
      return Status::Ok();
    }
  }
  if (fail_if_incompatible(room)) return Status::Ok();
  auto pf = pending_fail_.find(room);
  if (pf != pending_fail_.end()) {
    RoomStatus st = pf->second.second;
    pending_fail_.erase(pf);
    (void)take_pending_meta(room);
    fail(room, st.failure, false, &st.sender);
    return Status::Ok();
  }
  for (auto& [ts, md] : take_pending_meta(room)) apply_metadata(r, md);
  return Status::Ok();
}

Status PrefillEndpoint::send(uint64_t room, uint64_t first_page, const std::vector<uint64_t>& src_pages,
                             uint64_t tag) {
  auto it = rooms_.find(room);
  const bool last = it != rooms_.end() && first_page + src_pages.size() == it->second.total_pages;
  return send(room, first_page, src_pages, tag, {}, last);
}

Status PrefillEndpoint::send(uint64_t room, uint64_t first_page, const std::vector<uint64_t>& src_pages,
                             uint64_t tag, std::span<const uint64_t> state_indices, bool last, LayerRange layers) {
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return {ErrorCode::kInvalidArgument, "send() for an unknown room"};
  SenderRoom& r = it->second;
  KVPoll s = r.state.get();
  if (s != KVPoll::WaitingForInput && s != KVPoll::Transferring)
    return {ErrorCode::kInvalidArgument, fmt::format("send() in state {}", to_string(s))};
  if (r.last_received) return {ErrorCode::kInvalidArgument, "send() after the last chunk"};
  if (first_page > r.total_pages || src_pages.size() > r.total_pages - first_page)
    return {ErrorCode::kInvalidArgument, "send() past the room's last page"};
  const MemoryShape& ours = core_.shape();
  for (uint64_t p : src_pages)
    if (p >= ours.num_pages)
      return {ErrorCode::kInvalidArgument, fmt::format("local page {} out of range ({} pages)", p, ours.num_pages)};
  if (!last && !state_indices.empty())
    return {ErrorCode::kInvalidArgument, "state indices go with the last chunk only"};
  if (!state_indices.empty() && ours.state_offsets.empty())
    return {ErrorCode::kInvalidArgument, "state indices, but this rank registered no state buffer"};
  for (uint64_t i : state_indices)
    if (i >= ours.state_rows)
      return {ErrorCode::kInvalidArgument, fmt::format("state index {} out of range ({} rows)", i, ours.state_rows)};
  const uint32_t num_layers = static_cast<uint32_t>(r.layer_pages.size());
  auto range = resolve_layers(layers, num_layers);
  if (!range.ok()) return range.status();
  const uint64_t n = src_pages.size();
  for (uint32_t l = range->begin; l < range->end; ++l)
    if (r.layer_pages[l] + n > r.total_pages)
      return {ErrorCode::kInvalidArgument, fmt::format("send() past the room's last page: layer {} has {} of {} pages "
                                                       "sent, {} more",
                                                       l, r.layer_pages[l], r.total_pages, n)};
  for (uint32_t l = 0; last && l < num_layers; ++l) {
    const uint64_t sent = r.layer_pages[l] + (l >= range->begin && l < range->end ? n : 0);
    if (sent == r.total_pages) continue;
    if (std::all_of(r.layer_pages.begin(), r.layer_pages.end(), [&](uint64_t x) { return x == r.layer_pages[0]; }) &&
        range->begin == 0 && range->end == num_layers)
      return {ErrorCode::kInvalidArgument, fmt::format("the last chunk leaves {} of the room's {} pages unsent",
                                                       r.total_pages - sent, r.total_pages)};
    return {ErrorCode::kInvalidArgument, fmt::format("the last chunk leaves {} of the room's {} pages of layer {} unsent",
                                                     r.total_pages - sent, r.total_pages, l)};
  }
  const bool all_layers = range->begin == 0 && range->end == num_layers;
  const uint64_t units = n * (range->end - range->begin);
  if (!ours.aux_offsets.empty() && !r.aux_index)
    return {ErrorCode::kInvalidArgument, "this rank has aux buffers but the sender has no aux_index"};
  if (r.first_send_ns == 0) r.first_send_ns = monotonic_ns();
  r.progress_ns = monotonic_ns();
  r.state.advance(KVPoll::Transferring);
  if (last) {
    r.last_received = true;
    r.state_indices.assign(state_indices.begin(), state_indices.end());
  }
  for (uint32_t l = range->begin; l < range->end; ++l) r.layer_pages[l] += n;
  if (r.dests.empty()) {  // nothing to write (replicated heads, MLA non-source)
    if (!src_pages.empty()) {  // the chunk completes at once: its ChunkDone comes as for a write
      chunks_[tag] = {room, 1, true, units};
      ++r.inflight;
      core_.post({room, tag, Status::Ok(), 0, 0});
    }
    if (last && r.inflight == 0) conclude_room(r);
    return Status::Ok();
  }
  if (src_pages.empty()) {  // an empty last chunk: the final batch once every write completed
    maybe_finish(r);
    return Status::Ok();
  }
  FinalBatches finals;  // a last chunk with pages carries the final batch (prefill_final.cc)
  if (last && stage_final(r, finals) == FinalStage::kFailed)  // the room failed: this send writes nothing
    return {ErrorCode::kProtocolError, "the room's final batch does not match its destinations (the room failed)"};
  const PoolLayout& l = core_.layout();
  ChunkState& cs = chunks_[tag];
  cs = {room, 0, true, units};
  const uint64_t head_bytes = uint64_t(l.model.head_dim) * l.model.dtype_bytes;
  // A layer range writes only its layers' KV buffers (the same ones on both sides).
  std::vector<uint64_t> local_sel;
  if (!all_layers) local_sel = layer_buffer_offsets(ours.kv_offsets, num_layers, range->begin, range->end);
  for (const RankId& d : r.dests) {
    const DecodePeer& peer = peers_.at(d);
    const RoomMetadata& md = r.meta.at(d);
    // The room's kv_indices slice is read in place; every layer and head transfer of the chunk
    // goes into one batch (one transport write per destination per chunk).
    std::span<const uint64_t> dst(md.kv_indices.data() + first_page, src_pages.size());
    auto runs = coalesce_pages(std::span<const uint64_t>(src_pages), dst);
    PoolOffsets local{ours.page_bytes, ours.kv_offsets};
    PoolOffsets remote{peer.shape.page_bytes, peer.shape.kv_offsets};
    std::vector<uint64_t> remote_sel;
    if (!all_layers) {
      remote_sel = layer_buffer_offsets(peer.shape.kv_offsets, num_layers, range->begin, range->end);
      local.buffer_offsets = local_sel;
      remote.buffer_offsets = remote_sel;
    }
    std::vector<WriteOp> ops = take_write_ops();  // a recycled list: no fresh MiBs per chunk
    for (const HeadTransfer& t : plan_) {
      if (t.prefill_rank != core_.self().tp_rank || t.decode_rank != d.tp_rank) continue;
      SliceGeometry g;
      g.page_size = l.page_size;
      g.local_token_bytes = l.token_bytes();
      g.remote_token_bytes = peer.reg.page_bytes / peer.reg.page_size;
      // check_registration: both ranks' head ranges hold the transfer's heads.
      g.local_off = uint64_t(t.first_head - l.first_head) * head_bytes;
      g.remote_off = uint64_t(t.first_head - peer.reg.first_head) * head_bytes;
      g.slice_bytes = uint64_t(t.num_heads) * head_bytes;
      g.head_bytes = head_bytes;
      if (wrong_head_offset_ && t.num_heads > 1) g.rotate_heads = t.num_heads;
      bool whole_rows = g.slice_bytes == g.local_token_bytes && g.slice_bytes == g.remote_token_bytes;
      const size_t first_op = ops.size();
      if (whole_rows && g.rotate_heads == 0) {
        append_writes(runs, local, remote, ops);
      } else {
        append_slice_writes(runs, local, remote, g, ops);
      }
      // Integrity: the source bytes are hashed before they are written (endpoint/integrity.h:
      // one piece per token row slice, whole-row writes cut into rows).
      if (md.integrity)
        r.digests[d] += ops_digest(core_.map(), std::span<const WriteOp>(ops).subspan(first_op), g.slice_bytes);
    }
    for (auto& [fd, fops] : finals)
      if (fd == d) ops.insert(ops.end(), fops.begin(), fops.end());
    uint64_t bytes = 0;
    for (const WriteOp& op : ops) bytes += op.length;
    ++cs.remaining;
    ++r.inflight;
    EndpointCore* core = &core_;
    PeerId pid = peer.peer;
    core_.transport().write(peer.peer, room, std::move(ops), [core, room, tag, bytes, pid](Status st) {
      core->post({room, tag, std::move(st), bytes, pid});
    });
  }
  return Status::Ok();
}

std::optional<ChunkDone> PrefillEndpoint::on_transport_event(const TransportEvent& e) {
  auto room_it = rooms_.find(e.room);
  SenderRoom* r = room_it == rooms_.end() ? nullptr : &room_it->second;
  if (r && r->inflight > 0) --r->inflight;
  if (r) r->progress_ns = monotonic_ns();
  if (r && r->abandoned) ++abandoned_completed_;
  if (!r) on_abandoned_completion(e.room);
  bool deferred = false;  // the room fails by the link's verdict, attributed as it decides
  if (e.status.code() == ErrorCode::kPeerUnreachable) {  // the peer died, or only its link did
    for (auto& [rank, p] : peers_) {
      if (p.peer == e.peer) {
        on_transport_lost(rank, e.status.message(), monotonic_ns());  // may erase the entry
        break;
      }
    }
    deferred = awaits_link_verdict(e.peer);
  }
  if (!e.status.ok() && r && !deferred) {
    fail(e.room, e.status.code(), e.status.message(), core_.self(), monotonic_ns(), true);
  }
  if (r) free_staging_row(*r);
  auto aux = aux_tags_.find(e.tag);
  if (aux != aux_tags_.end()) {
    aux_tags_.erase(aux);
    if (r && e.status.ok()) r->bytes += e.bytes;
    if (r && e.status.ok() && !r->state.terminal() && r->inflight == 0) {  // every aux write landed
      send_status(*r, KVPoll::Success);
      r->state.advance(KVPoll::Success);
      log_event(LogLevel::kDebug, kComp, "transfer complete", room_fields(e.room));
    }
    if (r) maybe_send_terminal(*r);
    return std::nullopt;
  }
  auto ch = chunks_.find(e.tag);
  if (ch == chunks_.end()) return std::nullopt;
  ChunkState& cs = ch->second;
  cs.ok = cs.ok && e.status.ok();
  if (r && e.status.ok()) r->bytes += e.bytes;
  if (--cs.remaining > 0) return std::nullopt;
  ChunkDone done{cs.room, e.tag, cs.ok};
  uint64_t chunk_units = cs.units;
  chunks_.erase(ch);
  if (r) {
    if (done.ok) {
      r->units_done += chunk_units;  // once every destination has them
      maybe_finish(*r);
      maybe_succeed(*r);
    }
    maybe_send_terminal(*r);
  }
  return done;
}

void PrefillEndpoint::conclude_room(SenderRoom& r) {
  r.state.advance(KVPoll::Transferring);
  r.state.advance(KVPoll::Success);
  log_event(LogLevel::kDebug, kComp, "concluded without writing (no destination holds our heads)",
            room_fields(r.room));
}

Status PrefillEndpoint::conclude_without_writing(uint64_t room) {
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return {ErrorCode::kInvalidArgument, "unknown room"};
  SenderRoom& r = it->second;
  if (!r.dests.empty()) return {ErrorCode::kInvalidArgument, "the room has destinations"};
  if (r.state.get() != KVPoll::WaitingForInput) return {ErrorCode::kInvalidArgument, "not WaitingForInput"};
  conclude_room(r);
  return Status::Ok();
}

void PrefillEndpoint::send_status(SenderRoom& r, KVPoll state, bool terminal) {
  RoomStatus st{r.room, core_.self(), state, Failure{ErrorCode::kOk, core_.self(), "", 0, 0}, terminal};
  if (state == KVPoll::Failed) {
    auto e = core_.registry().get(r.room);
    if (e) st.failure = e->failure();
  }
  for (const RankId& d : dests_or_presumed(r)) {  // not bound yet: the only instance's, if one
    const std::string* peer = control_endpoint_of(d);
    if (!peer) continue;  // never registered: it cannot be waiting for our writes
    st.peer_incarnation = incarnation_of(d);
    st.digest.reset();
    if (state == KVPoll::Success) st.digest = digest_for(r, d);
    Status s = core_.send(*peer, st);
    if (!s.ok())
      log_event(LogLevel::kDebug, kComp, "status not delivered: " + s.str(), room_fields(r.room));
  }
  if (terminal) r.terminal_sent = true;
  else r.early_failure_sent = true;
}

std::optional<uint64_t> PrefillEndpoint::digest_for(const SenderRoom& r, const RankId& d) const {
  auto md = r.meta.find(d);
  if (md == r.meta.end() || !md->second.integrity || omit_digest_) return std::nullopt;
  auto it = r.digests.find(d);
  return it == r.digests.end() ? 0 : it->second;  // 0: nothing written to it (its decode expects that too)
}

void PrefillEndpoint::maybe_send_terminal(SenderRoom& r) {
  if (r.state.get() == KVPoll::Failed && !r.terminal_sent && r.inflight == 0) send_status(r, KVPoll::Failed);
}

void PrefillEndpoint::fail(uint64_t room, ErrorCode code, const std::string& reason, const RankId& origin,
                           int64_t first_seen_ns, bool observed_here, const RankId* via) {
  fail(room, Failure{code, origin, reason, first_seen_ns, 0}, observed_here, via);
}

void PrefillEndpoint::fail(uint64_t room, const Failure& f, bool observed_here, const RankId* via) {
  const ErrorCode code = f.code;
  const std::string& reason = f.reason;
  const RankId& origin = f.origin;
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return;
  SenderRoom& r = it->second;
  const bool primary = core_.registry().record(room, f, observed_here);
  if (primary) fresh_failures_.push_back(room);
  if (r.state.terminal()) {
    if (r.failed_ns == 0) r.failed_ns = monotonic_ns();  // concluded here, failed on another rank
    // The root cause moved (a record that precedes the one told) after the destinations were told
    // the room's failure: they are told the new one, so every rank ends with the same root cause
    // (docs/failure-model.md "Root cause"). It only moves earlier in the rule's order: it settles.
    if (primary && r.state.get() == KVPoll::Failed && r.terminal_sent) send_status(r, KVPoll::Failed);
    return;
  }
  r.state.advance(KVPoll::Failed);
  r.failed_ns = monotonic_ns();
  LogFields fields = failure_log_fields(room, f);
  if (via) fields.extra.push_back({"via", via->str()});
  log_event(LogLevel::kDebug, kComp, fmt::format("room failed: {} at {}: {}", code_name(code), origin.str(), reason),
            fields);
  // Writes in flight may take a while to drain (the transport is busy with other rooms): tell the
  // destinations now that the room failed, and that they are drained later (the terminal status).
  if (r.inflight > 0 && !r.early_failure_sent) send_status(r, KVPoll::Failed, /*terminal=*/false);
  maybe_send_terminal(r);
}

bool PrefillEndpoint::drained(uint64_t room) const {
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return true;
  const SenderRoom& r = it->second;
  if (r.abandoned) return true;  // past the drain deadline; decode keeps its pages quarantined
  if (r.inflight != 0) return false;
  if (r.state.get() == KVPoll::Success) return true;
  if (!r.terminal_sent) return false;
  for (const auto& [dst, md] : r.meta) {  // every destination's failure (its candidate) heard
    if (r.failure_heard.count(dst) || dead_peers_.count(dst)) continue;
    return r.failed_ns != 0 &&
           monotonic_ns() - r.failed_ns > core_.config().deadlines.drain_timeout_ms * 1'000'000;
  }
  return true;
}

void PrefillEndpoint::release(uint64_t room) {
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return;
  if (it->second.aux_staging) aux_alloc_.free({*it->second.aux_staging});
  if (it->second.abandoned && it->second.inflight > 0) remember_abandoned(it->second);
  std::vector<std::pair<RankId, uint64_t>> digests;
  if (it->second.state.get() == KVPoll::Success)
    for (const RankId& d : it->second.dests)
      if (auto dg = digest_for(it->second, d)) digests.emplace_back(d, *dg);
  const std::optional<uint32_t> engine = it->second.engine;
  bury(room, core_.registry().get(room), monotonic_ns(), std::move(digests));
  tombstones_[room].engine = engine;  // its instance's frames only are answered
  core_.registry().release(room);
  rooms_.erase(it);
  std::erase(fresh_failures_, room);
}

void PrefillEndpoint::bury(uint64_t room, std::optional<KVTransferError> cause, int64_t now_ns,
                           std::vector<std::pair<RankId, uint64_t>> digests) {
  const uint64_t seq = next_tomb_seq_++;
  Tombstone& t = tombstones_[room];
  t.seq = seq;
  const bool failed = cause.has_value();
  t.cause = failed ? std::make_unique<KVTransferError>(std::move(*cause)) : nullptr;
  t.digests = failed ? std::vector<std::pair<RankId, uint64_t>>{} : std::move(digests);
  std::deque<TombstoneRef>& fifo = failed ? failed_fifo_ : ok_fifo_;
  fifo.push_back({now_ns, room, seq});
  expire_tombstones(fifo, failed ? kMaxFailedTombstones : kMaxOkTombstones, now_ns);
}

void PrefillEndpoint::expire_tombstones(std::deque<TombstoneRef>& fifo, size_t cap, int64_t now_ns) {
  while (!fifo.empty() && (fifo.size() > cap || now_ns - fifo.front().release_ns > kTombstoneTtlNs)) {
    const TombstoneRef& ref = fifo.front();
    auto it = tombstones_.find(ref.room);
    // A room added again (add_room erased it) or released again (a newer seq) is not this entry's.
    if (it != tombstones_.end() && it->second.seq == ref.seq) tombstones_.erase(it);
    fifo.pop_front();
  }
}

void PrefillEndpoint::set_bootstrap_deadline(uint64_t room, int64_t deadline_ns) {
  auto it = rooms_.find(room);
  if (it != rooms_.end()) it->second.bootstrap_deadline_ns = deadline_ns;
}

void PrefillEndpoint::tick(int64_t now_ns) {
  for (const PeerError& pe : core_.take_peer_errors()) {
    for (auto& [rank, p] : peers_) {
      if (p.peer == pe.peer) {
        on_transport_lost(rank, pe.status.message(), now_ns);  // may erase the entry
        break;
      }
    }
  }
  for (const DeadPeer& d : core_.monitor().take_dead(now_ns))
    on_peer_dead(d.peer, fmt::format("no heartbeat for {} ms", d.silent_ms));
  judge_restart_claims(now_ns);
  challenge_unproven(core_, revivals_, now_ns, [&](const RankId& d) { return control_endpoint_of(d); });
  judge_suspect_links(now_ns);
  for (const RankId& peer : core_.monitor().take_revived()) {  // a transient loss, not a death
    auto reg = dead_regs_.find(peer);
    if (reg == dead_regs_.end() || connecting_.count(peer)) continue;  // a newer registration is connecting
    if (reg->second.incarnation < known_incarnation(peer)) continue;  // it restarted: its new one registers
    PoolRegistration r = reg->second;
    log_event(LogLevel::kDebug, kComp, fmt::format("{} answers again: reconnecting", peer.str()));
    on_registration(r);
  }
  check_connects(now_ns);
  check_write_deadlines(now_ns);
  forget_idle_instances(now_ns);
  std::vector<uint64_t> expired;
  for (auto& [id, r] : rooms_) {
    if (r.state.get() == KVPoll::Bootstrapping && now_ns > r.bootstrap_deadline_ns) expired.push_back(id);
    maybe_finish(r);
    maybe_send_terminal(r);
  }
  for (uint64_t id : expired) {
    SenderRoom& r = rooms_.at(id);
    std::string missing;
    for (const RankId& d : dests_or_presumed(r))
      if (!r.meta.count(d)) missing += (missing.empty() ? "" : ", ") + d.str();
    if (missing.empty()) missing = "any decode instance";
    // A room its destination kept renewing (prefill_renewal.cc) ends here at the renew limit.
    const int64_t waited_ms = (r.bootstrap_deadline_ns - r.created_ns) / 1'000'000;
    fail(id, ErrorCode::kBootstrapTimeout,
         r.renewals == 0 ? fmt::format("metadata from {} did not come within {} ms", missing, waited_ms)
                         : fmt::format("metadata from {} did not come within {} ms (the lease renewed by decode "
                                       "{} times; renewals end {} ms after the room's opening)",
                                       missing, waited_ms, r.renewals,
                                       std::max(core_.config().deadlines.renew_limit_ms,
                                                core_.config().deadlines.bootstrap_timeout_ms)),
         core_.self(), now_ns, true);
  }
  std::erase_if(pending_fail_, [&](const auto& kv) { return now_ns - kv.second.first > kPendingTtlNs; });
  std::vector<uint64_t> stale_meta;
  for (const auto& [room, list] : pending_meta_)
    if (list.empty() || now_ns - list.front().first > kPendingTtlNs) stale_meta.push_back(room);
  for (uint64_t room : stale_meta) (void)take_pending_meta(room);
  expire_tombstones(ok_fifo_, kMaxOkTombstones, now_ns);
  expire_tombstones(failed_fifo_, kMaxFailedTombstones, now_ns);
}

}  // namespace kvferry
