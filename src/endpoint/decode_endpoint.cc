#include "endpoint/decode_endpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "bootstrap/refusal.h"
#include "endpoint/room_list.h"
#include "kvferry/log.h"
#include "kvferry/routing.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
}

DecodeEndpoint::DecodeEndpoint(EndpointCore& core, std::vector<HeadTransfer> plan, std::string bootstrap_address,
                               uint32_t prefill_dp, Sharing sharing)
    : core_(core), plan_(std::move(plan)), prefill_dp_(std::max<uint32_t>(1, prefill_dp)),
      bootstrap_address_(std::move(bootstrap_address)), fence_(std::move(sharing.fence)) {
  if (sharing.own_monitor)
    own_monitor_ = std::make_unique<PeerMonitor>(core_.self(), core_.config().deadlines, core_.config().control,
                                                 core_.incarnation());
  if (!fence_) fence_ = std::make_shared<WriteFence>();
  core_.transport().set_write_fence(fence_);  // before any peer connects (decode_fence.cc)
}

void DecodeEndpoint::forget_sources() {
  for (const auto& [rank, p] : peers_) {
    monitor().unwatch(rank);
    core_.control().forget(p.control_endpoint);
  }
}

DecodeEndpoint::~DecodeEndpoint() {
  for (auto& [rank, r] : rediscovery_) {
    {
      std::lock_guard<std::mutex> lock(r->mu);
      r->stop = true;
    }
    r->thread.join();
  }
}

Status DecodeEndpoint::send_registration(const RankId& peer, const std::string& endpoint, uint64_t incarnation) {
  const PoolRegistration reg = make_registration(incarnation);
  Status s = core_.send(endpoint, reg);
  if (!s.ok()) return s;
  refused_.erase(peer);  // a new registration: a new answer
  const bool was_dead = dead_peers_.erase(peer) != 0;
  left_.erase(peer);
  monitor().watch(peer, endpoint);
  PrefillPeer& p = peers_[peer] = {peer, endpoint, 0, incarnation};
  p.watched_ns = monitor().last_heard_ns(peer);
  p.registered_ns = monotonic_ns();
  log_event(LogLevel::kDebug, kComp, fmt::format("registered pool with {} at {}", peer.str(), endpoint));
  if (was_dead) on_peer_back(peer, endpoint);  // after the registration: the peer reads it first
  return Status::Ok();
}

void DecodeEndpoint::on_peer_back(const RankId& peer, const std::string& endpoint) {
  size_t resumed = 0;
  for (auto& [id, r] : rooms_) {
    if (!r.init_called || r.state.get() != KVPoll::Bootstrapping || r.metadata_sent.count(peer)) continue;
    if (std::find(r.sources.begin(), r.sources.end(), peer) == r.sources.end()) continue;
    if (!send_metadata(r, peer, endpoint)) continue;
    ++resumed;
    maybe_waiting(r);
  }
  auto owed = owed_.find(peer);
  size_t told = 0;
  if (owed != owed_.end()) {
    for (RoomStatus st : owed->second) {
      st.peer_incarnation = peers_[peer].incarnation;  // whoever serves its rooms now
      Status s = core_.send(endpoint, st);
      if (!s.ok()) log_event(LogLevel::kDebug, kComp, "failure not delivered: " + s.str(), {.room = st.room});
      else ++told;
    }
    owed_.erase(owed);
  }
  if (resumed || told)
    log_event(LogLevel::kDebug, kComp,
              fmt::format("{} is back: metadata of {} waiting rooms sent, {} failures told", peer.str(), resumed, told));
}

bool DecodeEndpoint::send_metadata(ReceiverRoom& r, const RankId& src, const std::string& endpoint) {
  auto peer = peers_.find(src);
  RoomMetadata md{r.room, core_.self(), r.kv_indices, r.aux_index, r.state_indices,
                  static_cast<uint32_t>(r.sources.size())};
  md.integrity = core_.config().integrity;
  md.peer_incarnation = peer == peers_.end() ? 0 : peer->second.incarnation;
  Status s = core_.send(endpoint, md);
  if (!s.ok()) {
    fail(r.room, ErrorCode::kPeerUnreachable, fmt::format("metadata to {} not delivered: {}", src.str(), s.str()), src,
         monotonic_ns(), false);
    return false;
  }
  r.metadata_sent.insert(src);
  return true;
}

void DecodeEndpoint::maybe_waiting(ReceiverRoom& r) {
  if (r.state.get() != KVPoll::Bootstrapping || r.metadata_sent.size() < r.sources.size()) return;
  r.state.advance(KVPoll::WaitingForInput);
  r.init_ns = monotonic_ns();
  r.waiting_deadline_ns = r.init_ns + core_.config().deadlines.waiting_timeout_ms * 1'000'000;
  arm_reask(r, r.init_ns);
}

int64_t DecodeEndpoint::rejoin_deadline_ns(const RankId& peer) const {
  auto it = peers_.find(peer);
  int64_t since = it == peers_.end() ? 0 : it->second.dead_since_ns;
  return since + core_.config().deadlines.lookup_timeout_ms * 1'000'000;
}

void DecodeEndpoint::expire_dead_sources(int64_t now_ns) {
  for (const RankId& peer : dead_peers_) {
    if (now_ns <= rejoin_deadline_ns(peer)) continue;
    owed_.erase(peer);
    std::string why = fmt::format("{} is down and did not register again within {} ms", peer.str(),
                                  core_.config().deadlines.lookup_timeout_ms);
    std::vector<uint64_t> waiting;
    for (auto& [id, r] : rooms_) {
      if (r.state.terminal() || r.terminal.count(peer)) continue;
      if (std::find(r.sources.begin(), r.sources.end(), peer) != r.sources.end()) waiting.push_back(id);
    }
    for (uint64_t id : waiting) {
      rooms_.at(id).terminal.insert(peer);  // it never had the metadata, and it is gone
      fail(id, ErrorCode::kPeerUnreachable, why, peer, now_ns, false);
    }
  }
}

void DecodeEndpoint::rediscover(const RankId& peer, const std::string& old_endpoint, uint64_t old_incarnation) {
  if (rediscovery_.count(peer)) return;
  auto r = std::make_unique<Rediscovery>();
  Rediscovery* raw = r.get();
  std::string address = bootstrap_address_;
  Waker* waker = &core_.waker();
  r->thread = std::thread([raw, address, peer, old_endpoint, old_incarnation, waker] {
    BootstrapClient client(address, 500);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(raw->mu);
        if (raw->stop) return;
      }
      auto info = client.lookup(peer.engine_id, peer.dp_rank, peer.tp_rank);
      // A restart on the same endpoint shows as a new incarnation.
      if (info.ok() && (info->control_endpoint != old_endpoint || info->incarnation != old_incarnation)) {
        std::lock_guard<std::mutex> lock(raw->mu);
        raw->found = info->control_endpoint;
        raw->found_incarnation = info->incarnation;
        raw->found_info = *info;
        waker->signal();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  rediscovery_[peer] = std::move(r);
}

const ReceiverRoom* DecodeEndpoint::room(uint64_t room) const {
  auto it = rooms_.find(room);
  return it == rooms_.end() ? nullptr : &it->second;
}

KVPoll DecodeEndpoint::poll(uint64_t room) const {
  auto it = rooms_.find(room);
  return it == rooms_.end() ? KVPoll::Failed : it->second.state.get();
}

Status DecodeEndpoint::connect_peers(BootstrapClient& bootstrap, int64_t deadline_ns) {
  auto entries = look_up_sources(plan_, core_.self().tp_rank, prefill_dp_, bootstrap, deadline_ns);
  if (!entries.ok()) return entries.status();
  return adopt_sources(*entries);
}

Result<std::vector<PrefillRankInfo>> DecodeEndpoint::look_up_sources(const std::vector<HeadTransfer>& plan,
                                                                     uint32_t self_tp_rank, uint32_t prefill_dp,
                                                                     BootstrapClient& bootstrap, int64_t deadline_ns) {
  std::vector<uint32_t> wanted = sources_of(plan, self_tp_rank);
  std::vector<PrefillRankInfo> out;
  // Rooms are routed to a prefill DP rank by room id, so every DP rank's sources are peers.
  for (uint32_t dp = 0; dp < std::max<uint32_t>(1, prefill_dp); ++dp)
  for (uint32_t tp : wanted) {
    Result<PrefillRankInfo> info = bootstrap.lookup(0, dp, tp);
    while (!info.ok()) {
      if (bootstrap::permanent(info.status()))  // waiting will not change the secret, or bring back a rank that left
        return Status{info.status().code(), fmt::format("prefill dp{} tp{}: {}", dp, tp, info.status().message())};
      if (monotonic_ns() > deadline_ns)
        return Status{ErrorCode::kBootstrapTimeout,
                      fmt::format("prefill dp{} tp{} did not register at the bootstrap service within the lookup "
                                  "timeout: {}",
                                  dp, tp, info.status().str())};
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      info = bootstrap.lookup(0, dp, tp);
    }
    // The entry answers the key asked (a service that answers another rank's entry is not used).
    info->engine_id = 0;
    info->dp_rank = dp;
    info->tp_rank = tp;
    out.push_back(std::move(*info));
  }
  return out;
}

Status DecodeEndpoint::adopt_sources(const std::vector<PrefillRankInfo>& entries) {
  for (const PrefillRankInfo& info : entries) {
    RankId pr{Role::kPrefill, 0, info.tp_rank, info.dp_rank};
    // Before any other field of the entry is used (kvferry/compat.h; decode_compat.cc).
    if (Status c = check_source_compat(pr, info); !c.ok()) return c;
    // Open the data connection from this side before the prefill rank connects to us: its connect
    // then reuses it, and its sending socket is one its own listener accepted (docs/transport.md
    // "TCP congestion control"). A failure only costs that reuse.
    if (!info.transport_address.empty()) {
      Status r = core_.transport().connect_reverse(info.transport_address);
      if (!r.ok())
        log_event(LogLevel::kDebug, kComp, fmt::format("reverse connection to {}: {}", pr.str(), r.str()));
    }
    Status s = send_registration(pr, info.control_endpoint, info.incarnation);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

void DecodeEndpoint::on_message(const Message& m) {
  int64_t now = monotonic_ns();
  if (!admits(std::visit([](const auto& x) { return x.sender; }, m))) return;  // before anything else
  if (auto* hb = std::get_if<Heartbeat>(&m)) {
    if (hb->answer != 0) return on_challenge_answer(*hb);  // may name the claimed incarnation
    if (!accept_incarnation(hb->sender, hb->incarnation, 0, "Heartbeat")) return;
    monitor().heard(hb->sender, now);
    on_leaving(*hb);
    if (hb->leaving) return;
    if (hb->challenge != 0) answer_challenge(*hb);
    return;
  }
  if (auto* st = std::get_if<RoomStatus>(&m)) {
    if (!accept_incarnation(st->sender, st->incarnation, st->peer_incarnation, "RoomStatus")) return;
    monitor().heard(st->sender, now);
    on_status(*st);
    return close_fence_if_drained(st->room);
  }
  if (auto* rf = std::get_if<RegistrationRefusal>(&m)) {
    if (!accept_incarnation(rf->sender, rf->incarnation, rf->peer_incarnation, "RegistrationRefusal")) return;
    return on_refusal(*rf);
  }
  core_.peer_debug(kComp, fmt::format("ignored {} frame", message_name(m)));
}

void DecodeEndpoint::on_status(const RoomStatus& st) {
  auto it = rooms_.find(st.room);
  if (it == rooms_.end()) {
    if (st.terminal && quarantined_.count(st.room)) return drain_confirmed(st.room, st.sender);
    core_.peer_debug(kComp, "status for an unknown room dropped", {.room = st.room});
    return;
  }
  ReceiverRoom& r = it->second;
  bool is_source = false;
  for (const RankId& s : r.sources) is_source |= (s == st.sender);
  if (!is_source) {
    core_.peer_debug(kComp, fmt::format("status from {} which is not a source", st.sender.str()),
                   {.room = st.room});
    return;
  }
  if (!st.terminal) {
    // An early failure notice: the room failed, but this source may still be writing into its
    // pages. It is not terminal: drained() waits for its terminal status (or the drain deadline,
    // then the pages are quarantined).
    r.failure_heard.insert(st.sender);
    fail(st.room, st.failure, false, &st.sender);
    return;
  }
  r.terminal.insert(st.sender);
  if (st.state == KVPoll::Failed) {
    fail(st.room, st.failure, false, &st.sender);  // answers the sources once all are terminal
    return;
  }
  answer_sources(r, monotonic_ns());
  if (st.state != KVPoll::Success || r.state.terminal()) return;
  r.succeeded.insert(st.sender);
  r.digests[st.sender] = st.digest;  // used only if this rank asked for it (decode_conclude.cc)
  if (st.state == KVPoll::Success) serving_.insert(st.sender);  // it has written into our pool
  if (r.succeeded.size() < r.sources.size()) return;
  conclude(r);  // every source is done (its aux, state and guard rows were flushed before its Success)
}

void DecodeEndpoint::add_room(uint64_t room, uint64_t input_tokens, int64_t prefill_dp_rank) {
  if (auto it = rooms_.find(room); it != rooms_.end()) {
    // Added before its size was known (Receiver::init): sized now, before init().
    if (!it->second.init_called && input_tokens != 0) {
      it->second.input_tokens = input_tokens;
      it->second.total_pages = core_.layout().pages_for(input_tokens);
    }
    return;
  }
  ReceiverRoom& r = rooms_[room];
  r.room = room;
  r.input_tokens = input_tokens;
  r.total_pages = core_.layout().pages_for(input_tokens);
  const uint32_t dp = prefill_dp_rank >= 0 ? static_cast<uint32_t>(prefill_dp_rank) : dp_rank_for_room(room, prefill_dp_);
  for (uint32_t p : sources_of(plan_, core_.self().tp_rank)) r.sources.push_back({Role::kPrefill, 0, p, dp});
  core_.registry().open(room);
  if (fail_if_refused(room)) return;
  // A source that is down may already be back (its engine may hold this room): the room waits
  // for it to register again, up to its rejoin deadline (expire_dead_sources).
  const int64_t now = monotonic_ns();
  for (const RankId& src : r.sources) {
    if (!dead_peers_.count(src)) continue;
    if (now > rejoin_deadline_ns(src)) {
      r.terminal.insert(src);
      fail(room, ErrorCode::kPeerUnreachable,
           fmt::format("{} is down and did not register again within {} ms", src.str(),
                       core_.config().deadlines.lookup_timeout_ms),
           src, now, false);
      return;
    }
    log_event(LogLevel::kDebug, kComp, fmt::format("{} is down: the room waits for it to register again", src.str()),
              {.room = room});
  }
}

Status DecodeEndpoint::init(uint64_t room, const std::vector<uint64_t>& kv_indices, uint32_t aux_slot) {
  return init(room, kv_indices, aux_slot, {});
}

Status DecodeEndpoint::init(uint64_t room, const std::vector<uint64_t>& kv_indices, uint64_t aux_index,
                            std::span<const uint64_t> state_indices) {
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return {ErrorCode::kInvalidArgument, "init() for an unknown room"};
  ReceiverRoom& r = it->second;
  if (r.init_called) return {ErrorCode::kInvalidArgument, "init() twice"};
  const bool failed_before = r.state.get() == KVPoll::Failed;
  if (r.state.get() != KVPoll::Bootstrapping && !failed_before)
    return {ErrorCode::kInvalidArgument, "init() after the room left Bootstrapping"};
  if (kv_indices.size() != r.total_pages) return {ErrorCode::kInvalidArgument, "kv_indices size != room pages"};
  const MemoryShape& sh = core_.shape();
  for (uint64_t p : kv_indices)
    if (p >= sh.num_pages)
      return {ErrorCode::kInvalidArgument, fmt::format("page {} out of range ({} pages)", p, sh.num_pages)};
  if (aux_index >= sh.aux_rows)
    return {ErrorCode::kInvalidArgument, fmt::format("aux_index {} out of range ({} rows)", aux_index, sh.aux_rows)};
  if (state_indices.size() > kMaxStateIndices)
    return {ErrorCode::kInvalidArgument, fmt::format("{} state indices (at most {})", state_indices.size(), kMaxStateIndices)};
  if (!state_indices.empty() && sh.state_offsets.empty())
    return {ErrorCode::kInvalidArgument, "state indices, but this rank registered no state buffer"};
  for (uint64_t i : state_indices)
    if (i >= sh.state_rows)
      return {ErrorCode::kInvalidArgument, fmt::format("state index {} out of range ({} rows)", i, sh.state_rows)};
  r.kv_indices = kv_indices;
  r.aux_index = aux_index;
  r.state_indices.assign(state_indices.begin(), state_indices.end());
  r.init_called = true;
  if (failed_before) return Status::Ok();  // it failed first (e.g. a refusing source): nothing goes out
  open_fence(r);  // from now on the room's pages take writes naming it
  std::memset(core_.guard_row(aux_index), 0, kAuxSlotBytes);
  for (const RankId& src : r.sources) {
    auto peer = peers_.find(src);
    if (peer == peers_.end()) {
      fail(room, ErrorCode::kPeerUnreachable, fmt::format("no connection to {}", src.str()), src, monotonic_ns(), false);
      return Status::Ok();
    }
    if (dead_peers_.count(src)) continue;  // sent when it registers again (on_peer_back)
    if (!send_metadata(r, src, peer->second.control_endpoint)) return Status::Ok();
  }
  maybe_waiting(r);
  return Status::Ok();
}

void DecodeEndpoint::tell_sources(ReceiverRoom& r, const KVTransferError& e, bool update) {
  if (r.failure_told && !update) return;
  r.failure_told = true;
  // Until every source is terminal this is an early notice (terminal=false): the sources stop
  // writing, but it does not let them release. The final answer (answer_sources) carries the root
  // cause once every source's own failure, if any, is known here (docs/failure-model.md "Root cause").
  send_to_sources(r, RoomStatus{r.room, core_.self(), KVPoll::Failed, e.failure(), r.final_told});
}

void DecodeEndpoint::send_to_sources(ReceiverRoom& r, const RoomStatus& st, bool succeeded) {
  for (const RankId& src : r.sources) {
    // A source that succeeded is done with the room; every other one waits for our failure (even
    // one that told us first: it is the answer that lets it release, docs/failure-model.md).
    if (r.succeeded.count(src) && !succeeded) continue;
    auto peer = peers_.find(src);
    if (peer == peers_.end()) continue;
    if (dead_peers_.count(src)) {  // it may be back with this room before we find it again
      if (st.terminal) owed_[src].push_back(st);
      continue;
    }
    RoomStatus to = st;
    to.peer_incarnation = peer->second.incarnation;  // the incarnation it registered us with
    send_or_hold(src, peer->second.control_endpoint, to);
  }
}

void DecodeEndpoint::answer_sources(ReceiverRoom& r, int64_t now_ns, bool force) {
  if (r.final_told || r.state.get() != KVPoll::Failed) return;
  bool all_terminal = true;
  for (const RankId& src : r.sources) all_terminal &= r.terminal.count(src) > 0 || dead_peers_.count(src) > 0;
  const bool drain_over = r.failed_ns != 0 && now_ns - r.failed_ns > core_.config().deadlines.drain_timeout_ms * 1'000'000;
  if (!all_terminal && !drain_over && !force) return;
  auto e = core_.registry().get(r.room);
  if (!e) return;
  r.final_told = true;
  r.failure_told = true;
  send_to_sources(r, RoomStatus{r.room, core_.self(), KVPoll::Failed, e->failure(), true});
}

void DecodeEndpoint::fail(uint64_t room, ErrorCode code, const std::string& reason, const RankId& origin,
                          int64_t first_seen_ns, bool observed_here, const RankId* via) {
  fail(room, Failure{code, origin, reason, first_seen_ns, 0}, observed_here, via);
}

void DecodeEndpoint::fail(uint64_t room, const Failure& f, bool observed_here, const RankId* via) {
  const ErrorCode code = f.code;
  const std::string& reason = f.reason;
  const RankId& origin = f.origin;
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return;
  ReceiverRoom& r = it->second;
  const bool primary = core_.registry().record(room, f, observed_here);
  if (primary) fresh_failures_.push_back(room);
  // A room that already succeeded here can still fail on another rank of the engine: its sources
  // are done with it, the registry holds the cause and the driver reports it; Success stays.
  if (r.state.terminal()) {
    if (r.failed_ns == 0) r.failed_ns = monotonic_ns();  // concluded here, failed on another rank
    // The root cause moved after the sources were told (a record that precedes the told one, e.g.
    // a second source's local failure that came in later): they are told the new one, so every
    // rank ends with the same root cause (docs/failure-model.md "Root cause").
    if (primary && r.state.get() == KVPoll::Failed && r.failure_told) {
      if (auto e = core_.registry().get(room)) tell_sources(r, *e, /*update=*/true);
    }
    answer_sources(r, monotonic_ns());
    return;
  }
  r.state.advance(KVPoll::Failed);
  r.failed_ns = monotonic_ns();
  arm_reask(r, r.failed_ns);  // until every source's terminal status came
  LogFields fields = failure_log_fields(room, f);
  if (via) fields.extra.push_back({"via", via->str()});
  log_event(LogLevel::kDebug, kComp, fmt::format("room failed: {} at {}: {}", code_name(code), origin.str(), reason),
            fields);
  auto e = core_.registry().get(room);
  if (e) tell_sources(r, *e);
  answer_sources(r, r.failed_ns);
}

bool DecodeEndpoint::drained(uint64_t room, int64_t now_ns) const {
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return true;
  const ReceiverRoom& r = it->second;
  if (!r.state.terminal()) return false;
  for (const RankId& src : r.metadata_sent)
    if (!r.terminal.count(src)) return r.failed_ns != 0 && now_ns - r.failed_ns > core_.config().deadlines.drain_timeout_ms * 1'000'000;
  return fence_done(r);  // every source is terminal: the room's fence closed, its last placement done
}

void DecodeEndpoint::set_waiting_deadline(uint64_t room, int64_t deadline_ns) {
  auto it = rooms_.find(room);
  if (it != rooms_.end()) it->second.waiting_deadline_ns = deadline_ns;
}

void DecodeEndpoint::tick(int64_t now_ns) {
  for (const DeadPeer& d : monitor().take_dead(now_ns))
    on_peer_dead(d.peer, fmt::format("no heartbeat for {} ms", d.silent_ms));
  judge_restart_claims(now_ns);
  retry_refused(now_ns);
  resend_unanswered(now_ns);
  challenge_unproven(core_, monitor(), revivals_, now_ns, [&](const RankId& s) {
    auto it = peers_.find(s);
    return it == peers_.end() ? nullptr : &it->second.control_endpoint;
  });
  for (const RankId& peer : monitor().take_revived()) {  // a long silence, not a death
    auto it = peers_.find(peer);
    if (it != peers_.end() && dead_peers_.count(peer)) {
      log_event(LogLevel::kDebug, kComp, fmt::format("{} answers again", peer.str()));
      (void)send_registration(peer, it->second.control_endpoint, it->second.incarnation);
    }
  }
  for (auto it = rediscovery_.begin(); it != rediscovery_.end();) {
    std::string found;
    uint64_t found_incarnation = 0;
    PrefillRankInfo info;
    {
      std::lock_guard<std::mutex> lock(it->second->mu);
      found = it->second->found;
      found_incarnation = it->second->found_incarnation;
      info = it->second->found_info;
    }
    if (found.empty() && dead_peers_.count(it->first)) {
      ++it;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(it->second->mu);
      it->second->stop = true;
    }
    it->second->thread.join();
    if (!found.empty() && dead_peers_.count(it->first)) {
      log_event(LogLevel::kDebug, kComp, fmt::format("{} restarted at {}", it->first.str(), found));
      auto known = peers_.find(it->first);
      // A newer incarnation registered: the process we presumed dead is gone for sure.
      if (known != peers_.end() && found_incarnation != known->second.incarnation) source_restarted(it->first);
      if (admit_rediscovered(it->first, info)) (void)send_registration(it->first, found, found_incarnation);
    }
    it = rediscovery_.erase(it);
  }
  if (!dead_peers_.empty()) {
    expire_dead_sources(now_ns);
    reclaim_from_gone_sources(now_ns);
  }
  tick_fences();
  for (auto& [id, r] : rooms_)
    if (r.state.get() == KVPoll::Failed && !r.final_told) answer_sources(r, now_ns);
  flush_held_statuses();
  reask(now_ns);
  renew(now_ns);
  std::vector<uint64_t> expired;
  for (auto& [id, r] : rooms_)
    if (r.state.get() == KVPoll::WaitingForInput && now_ns > r.waiting_deadline_ns) expired.push_back(id);
  for (uint64_t id : expired) {
    ReceiverRoom& r = rooms_.at(id);
    std::string missing;
    for (const RankId& s : r.sources)
      if (!r.succeeded.count(s)) missing += (missing.empty() ? "" : ", ") + s.str();
    fail(id, ErrorCode::kWaitingTimeout,
         fmt::format("no data from {} within {} ms of sending the metadata", missing,
                     (r.waiting_deadline_ns - r.init_ns) / 1'000'000),
         core_.self(), now_ns, true);
  }
}

void DecodeEndpoint::release(uint64_t room) {
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return;
  if (it->second.state.get() == KVPoll::Failed && !it->second.final_told) {
    answer_sources(it->second, monotonic_ns(), /*force=*/true);  // released: the answer is owed now
  }
  // Released or quarantined: the fence refuses the room's writes from now on; placements still
  // running keep the pages quarantined until they are done (decode_fence.cc).
  const bool placements = close_fence(it->second) > 0;
  if (it->second.state.get() == KVPoll::Failed || placements) quarantine(it->second, placements);
  core_.registry().release(room);
  rooms_.erase(it);
  std::erase(fresh_failures_, room);
}

}  // namespace kvferry
