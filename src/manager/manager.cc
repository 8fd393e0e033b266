// Manager::create and the rank's progress (kvferry/manager.h); the per-room handles are in
// room_handles.cc.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "bootstrap/refusal.h"
#include "endpoint/topology.h"
#include "kvferry/bootstrap.h"
#include "kvferry/control.h"
#include "kvferry/log.h"
#include "kvferry/routing.h"
#include "manager/compat_of.h"
#include "manager/log_policy.h"
#include "manager/manager_internal.h"

namespace kvferry {
namespace {

Status bad(std::string what) { return {ErrorCode::kInvalidArgument, std::move(what)}; }

// After a lookup of the failure board that waited in vain (ManagerImpl::kBoardQuietNs), lookups wait
// at most this long: long enough for an origin's post that races the engine's agreement, short
// enough that many rooms whose records never come do not stall the engine.
constexpr int64_t kBoardQuietWaitMs = 25;
// The shortest timeout of one try of a wait (its last tries), and the timeout of the one look of a
// room that failed here (wait 0: a loaded host answers slowly, and that look decides which of two
// independent failures is the root cause).
constexpr int64_t kBoardTryMinMs = 25;
constexpr int64_t kBoardLookMs = 200;

}  // namespace

Result<std::unique_ptr<Manager>> Manager::create(const ManagerConfig& config) {
  std::unique_ptr<ManagerImpl> m(new ManagerImpl(config));
  Status s = m->start();
  if (!s.ok()) return s;
  if (config.progress_thread) m->thread_ = std::thread([raw = m.get()] { raw->run(); });
  return std::unique_ptr<Manager>(std::move(m));
}

Status ManagerImpl::start() {
  const ManagerConfig& c = config_;
  if (c.page_size == 0) return bad("page_size must be at least 1 token");
  if (c.tp_size == 0 || c.self.tp_rank >= c.tp_size)
    return bad(fmt::format("tp_rank {} is outside a TP size of {}", c.self.tp_rank, c.tp_size));
  if (c.peer_dp_size == 0) return bad("peer_dp_size must be at least 1");
  if (c.transfer_shards < 1 || c.transfer_shards > kMaxTransportShards)
    return bad(fmt::format("transfer_shards {} is outside 1..{}", c.transfer_shards, kMaxTransportShards));
  if (c.pool_base != nullptr && c.pool_bytes == 0) return bad("the engine's pool is empty (pool_bytes 0)");
  if (!c.buffers.empty() && c.pool_base != nullptr) return bad("give either engine buffers or a pool, not both");
  if (Status known = check_transport_name(c.transport); !known.ok()) return known;
  // With engine buffers the layout only plans heads and pages; the buffers set its page count
  // and aux rows (EndpointCore).
  const uint64_t layout_bytes = c.buffers.empty() ? c.pool_bytes : ~0ull >> 8;
  auto layout = make_layout(c.model, c.tp_size, c.self.tp_rank, c.page_size, layout_bytes, c.aux_rows);
  if (!layout.ok()) return layout.status();  // names the pool's size
  const uint32_t peer_tp = c.peer_tp_size ? c.peer_tp_size : c.tp_size;
  const bool prefill = c.self.role == Role::kPrefill;
  auto plan = plan_transfers(c.model, prefill ? c.tp_size : peer_tp, prefill ? peer_tp : c.tp_size);
  if (!plan.ok()) return plan.status();
  plan_ = *plan;

  EndpointConfig ec;
  ec.self = c.self;
  ec.layout = *layout;
  ec.transport = c.transport;
  ec.transfer_shards = c.transfer_shards;
  ec.tcp_congestion = c.tcp_congestion;
  ec.control = c.control;
  ec.deadlines = c.deadlines;
  ec.external_base = c.pool_base;
  ec.external_bytes = c.pool_base ? c.pool_bytes : 0;
  ec.fault_injection = c.fault_injection;
  ec.integrity = c.integrity;
  ec.max_decode_instances = c.max_decode_instances;
  ec.decode_instance_idle_ms = c.decode_instance_idle_ms;
  for (const BufferDesc& b : c.buffers)
    if (c.integrity && b.memory != MemoryKind::kHost)  // digests read the bytes on the host
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("integrity needs host memory; a buffer is {} memory", memory_kind_name(b.memory)));
  ec.buffers = c.buffers;
  auto core = EndpointCore::create(ec);
  if (!core.ok()) return core.status();
  core_ = std::move(core).value();
  core_->set_compat(compat_of(c, core_->shape(), prefill ? c.tp_size : peer_tp, prefill ? peer_tp : c.tp_size));
  // Before the bootstrap service is reached (which may take up to lookup_timeout_ms).
  log_event(LogLevel::kDebug, "manager",
            fmt::format("pool: {} pages of {} tokens, {} KV buffers, {} engine buffers, transport {}, control {}",
                        core_->layout().num_pages, core_->layout().page_size, core_->layout().num_buffers(),
                        c.buffers.size(), c.transport, core_->control_endpoint()));

  if (prefill) {
    prefill_ = std::make_unique<PrefillEndpoint>(*core_, plan_, c.peer_dp_size);
    // Senders not init()ed yet whose destination dies fail with the death (and are named in its
    // warning), as init()ed rooms bound for it do. Runs under the lock (progress).
    prefill_->set_unopened_rooms_hook([this](const RankId& dead, const std::string& reason, int64_t now) {
      std::vector<uint64_t> failed;
      const std::vector<uint32_t> dests = dests_of(plan_, self().tp_rank);
      if (std::find(dests.begin(), dests.end(), dead.tp_rank) == dests.end()) return failed;
      for (auto& [id, r] : rooms_) {
        if (r.initialized || r.early_failure || dp_rank_for_room(id, config_.peer_dp_size) != dead.dp_rank) continue;
        // Only a sender of the dead rank's decode instance (its metadata's, or the only one known).
        if (prefill_->presumed_engine(id) != std::optional<uint32_t>(dead.engine_id)) continue;
        const Failure f{ErrorCode::kPeerUnreachable, dead, reason, now, 0};
        if (!open_sender_for_failure(id, r, f, false)) r.early_failure = KVTransferError::from(id, f, true);
        failed.push_back(id);
      }
      return failed;
    });
    prefill_->set_unopened_failure_hook([this](uint64_t id, const Failure& f) {
      auto it = rooms_.find(id);
      return it != rooms_.end() && open_sender_for_failure(id, it->second, f, false);
    });
    if (!c.bootstrap_address.empty()) {
      PrefillRankInfo info;
      info.engine_id = c.self.engine_id;
      info.tp_rank = c.self.tp_rank;
      info.dp_rank = c.self.dp_rank;
      info.tp_size = c.tp_size;
      info.host = c.control.advertised();
      info.control_endpoint = core_->control_endpoint();
      info.page_size = c.page_size;
      info.dtype = c.model.dtype_bytes == 2 ? "bfloat16" : fmt::format("{}-byte", c.model.dtype_bytes);
      info.model = c.model.name;
      info.num_layers = c.model.num_layers;
      info.heads_per_rank = layout->heads_per_rank;
      info.first_head = layout->first_head;
      info.incarnation = core_->incarnation();
      info.transport_address = core_->transport().address();
      info.compat = core_->compat();
      BootstrapClient bootstrap(c.bootstrap_address, 2000);
      Status s = bootstrap.register_rank(info);
      for (int64_t deadline = monotonic_ns() + c.deadlines.lookup_timeout_ms * 1'000'000;
           !s.ok() && !bootstrap::not_authorized(s) && monotonic_ns() < deadline;) {
        wait_readable(nullptr, 0, 50);
        s = bootstrap.register_rank(info);
      }
      if (!s.ok()) return Status(s.code(), "bootstrap registration at " + c.bootstrap_address + ": " + s.message());
    }
  } else {
    if (c.max_prefill_instances == 0) return bad("max_prefill_instances must be at least 1");
    decoding_ = true;
    core_->transport().set_write_fence(fence_);  // before any peer connects (decode_fence.cc)
    if (!c.bootstrap_address.empty()) {
      std::unique_lock lock(mu_);
      Result<DecodeEndpoint*> ep = prefill_instance(c.bootstrap_address, lock);
      if (!ep.ok()) return ep.status();
    }
  }
  log_event(LogLevel::kDebug, "manager", "rank up: " + std::string(prefill ? "registered at " : "found ") +
                                             (c.bootstrap_address.empty() ? "no bootstrap service" : c.bootstrap_address));
  return Status::Ok();
}

ManagerImpl::~ManagerImpl() {
  stop_ = true;
  if (core_) core_->waker().signal();
  if (thread_.joinable()) thread_.join();
  if (leaver_.joinable()) leaver_.join();  // it removes the bootstrap entry now (bounded), leave.cc
  std::lock_guard lock(mu_);
  if (prefill_ || decoding_) log_unsettled_failures();  // rooms the engine still held: logged as known now
  prefill_.reset();
  instances_.clear();
  core_.reset();  // the transport goes before the engine may free its memory
  rooms_.clear();
}

void ManagerImpl::run() {
  while (!stop_) {
    int fds[2] = {core_->waker().fd(), core_->control().fd()};
    wait_readable(fds, 2, static_cast<int>(std::max<int64_t>(1, config_.progress_interval_ms)));
    if (stop_) break;
    std::lock_guard lock(mu_);
    progress_control();
    progress_events();
    progress_tick();
  }
}

std::vector<int> ManagerImpl::wait_fds() const {
  if (config_.progress_thread) return {};
  return {core_->waker().fd(), core_->control().fd()};
}

void ManagerImpl::progress() {
  if (config_.progress_thread) return;
  std::lock_guard lock(mu_);
  progress_control();
  progress_events();
  progress_tick();
}

void ManagerImpl::progress_inline() {
  std::lock_guard lock(mu_);
  const int64_t now = monotonic_ns();
  if (now - last_inline_ns_ < kInlineProgressNs) return;
  last_inline_ns_ = now;
  progress_control(false);  // the waker stays set: what it asks for (e.g. a tick) is the thread's
  progress_events();
}

void ManagerImpl::progress_control(bool drain_waker) {
  std::lock_guard lock(mu_);
  if (drain_waker) core_->waker().drain();
  for (int i = 0; i < 4096; ++i) {
    auto frame = core_->control().recv(std::chrono::milliseconds(0));
    if (!frame) break;
    // A sender that is no peer of this rank in the plan is refused before the frame is decoded.
    const std::optional<RankId> sender = frame_sender(*frame);
    if (sender && !(prefill_ ? prefill_->admits(*sender) : decode_admits(*sender))) continue;
    // A pool registration's compatibility fingerprint is compared before the rest is decoded.
    if (sender && prefill_ && !prefill_->admits_compat(*frame)) continue;
    // A RoomMetadata names the decode rank's pages, not this rank's: a prefill rank's pool (e.g. a
    // staging ring) can be smaller than a room. The count is bounded by what the frame limit lets
    // through (ControlLimits::frame_bytes_for_pages, 8 bytes an index), refused by the codec before
    // allocating; each index is then checked against the sender's registered pool.
    const uint64_t pages = ControlLimits::frame_bytes_for_pages(core_->layout().num_pages) / 8;
    auto msg = kvferry::decode(*frame, static_cast<uint32_t>(std::min<uint64_t>(pages, kMaxKvIndices)));
    if (!msg.ok()) {
      LogFields f{.origin = sender ? sender->str() : std::string()};
      core_->refusal_log().refuse(Refusal::kMalformed, "rejected control frame: " + msg.status().str(), std::move(f),
                                  monotonic_ns());
      continue;
    }
    if (message_hook_) message_hook_(*msg);
    if (prefill_) prefill_->on_message(*msg);
    else dispatch_decode(*msg);
  }
  if (prefill_ && prefill_->incompatible_refusals() != incompatible_seen_) {
    // A decode rank refused as incompatible: senders not init()ed yet bound for it fail now.
    incompatible_seen_ = prefill_->incompatible_refusals();
    for (auto& [id, r] : rooms_) {
      if (r.initialized || r.early_failure) continue;
      if (std::optional<Failure> f = prefill_->incompatible_destination(id); f && !open_sender_for_failure(id, r, *f, false))
        r.early_failure = KVTransferError::from(id, *f, true);
    }
  }
}

void ManagerImpl::progress_events() {
  std::lock_guard lock(mu_);
  for (const TransportEvent& e : core_->take_events()) {
    if (!prefill_) continue;  // decode issues no writes
    auto done = prefill_->on_transport_event(e);
    if (done) chunk_done(*done);
  }
}

void ManagerImpl::chunk_done(const ChunkDone& done) {
  if (done.tag >= kSenderTagBase && done.tag < (1ull << 62)) {
    auto it = rooms_.find(done.room);
    if (it == rooms_.end()) return;
    Room& r = it->second;
    if (r.chunks_out > 0) --r.chunks_out;
    if (auto s = r.send_of_tag.find(done.tag); s != r.send_of_tag.end()) {
      r.completed_sends.push_back(s->second);
      r.send_of_tag.erase(s);
    }
  } else if (chunk_hook_) {
    chunk_hook_(done);
  }
}

bool ManagerImpl::open_sender_for_failure(uint64_t id, Room& r, const Failure& f, bool observed_here) {
  if (!prefill_ || r.initialized || r.early_failure) return false;
  prefill_->add_failed_room(id, f, observed_here);
  if (!prefill_->has_room(id)) return false;
  r.initialized = true;
  r.total_pages = 1;
  r.next_page.assign(layout().model.num_layers, 0);
  return true;
}

void ManagerImpl::progress_tick() {
  std::lock_guard lock(mu_);
  const int64_t now = monotonic_ns();
  if (prefill_) {
    prefill_->tick(now);
    for (const ChunkDone& done : prefill_->take_abandoned_chunks()) chunk_done(done);  // staging moves on
  } else {
    tick_instances(now);
  }
  housekeeping(now);
}

ManagerImpl::Room* ManagerImpl::room(uint64_t id) {
  auto it = rooms_.find(id);
  return it == rooms_.end() ? nullptr : &it->second;
}

// A failed room is logged once, when its failure is settled (docs/manager.md "Failure logging"):
// a room failed before init involves no peer and is logged at once; an initialized room only when
// it is release-safe (prefill: every destination answered with its failure; decode: every source
// terminal), so the failures of other ranks that race this one have arrived and the root-cause
// rule (docs/failure-model.md) has picked its winner. Only the winner's rank logs above debug; a
// rank whose own failure lost logs it at debug with "superseded by ORIGIN".
void ManagerImpl::log_failure_once(uint64_t id, Room& r) {
  if (r.logged || config_.failure_log_component.empty()) return;
  std::optional<Failure> root;
  std::optional<Failure> own;
  if (r.early_failure) {
    root = r.early_failure->failure();
    if (!r.early_failure->is_from_another_rank) own = root;
  } else if (r.initialized) {
    if (auto e = core_->registry().get(id)) root = e->failure();
    own = core_->registry().own(id);
  }
  if (!root) return;
  r.logged = true;
  const FailureLine line = failure_release_line(self().role, id, *root, own);
  log_event(line.level, config_.failure_log_component, line.msg, line.fields);
}

void ManagerImpl::log_unsettled_failures() {
  for (auto& [id, r] : rooms_) {
    if (r.logged) continue;
    if (!r.initialized && !r.early_failure) continue;
    const KVPoll p = r.early_failure ? KVPoll::Failed : prefill_ ? prefill_->poll(id) : r.ep->poll(id);
    if (p == KVPoll::Failed || (p == KVPoll::Success && core_->registry().get(id))) log_failure_once(id, r);
  }
}

bool ManagerImpl::release_safe_locked(uint64_t id, const Room& r, int64_t now) const {
  if (!r.initialized) return true;
  if (prefill_) return r.chunks_out == 0 && prefill_->drained(id);
  return r.ep->drained(id, now);
}

void ManagerImpl::housekeeping(int64_t now) {
  for (auto it = rooms_.begin(); it != rooms_.end();) {
    const uint64_t id = it->first;
    Room& r = it->second;
    if (r.initialized) {
      KVPoll p = prefill_ ? prefill_->poll(id) : r.ep->poll(id);
      if (prefill_ && r.metrics.metadata_ns == 0 && p >= KVPoll::WaitingForInput) r.metrics.metadata_ns = now;
      if (r.metrics.done_ns == 0 && (p == KVPoll::Success || p == KVPoll::Failed)) r.metrics.done_ns = now;
      // A room that concluded here and failed since (the engine's failure, or a peer's told after
      // this rank's Success) polls Failed through its handle: it is logged and posted as one.
      const bool failed = p == KVPoll::Failed || (p == KVPoll::Success && core_->registry().get(id));
      if (failed && !r.logged && release_safe_locked(id, r, now)) log_failure_once(id, r);
      if (failed && !r.posted) {
        // The room's root cause as known here: the rank's own record, or one a peer told it (so a
        // record reaches the board even when its origin died before posting it).
        r.posted = true;
        // Never a fallback: a record naming this rank that it did not observe (fail_from_agreement
        // found nothing) would make other ranks name this one.
        std::optional<KVTransferError> e = core_->registry().get(id);
        if (e && (e->origin != self() || core_->registry().own(id))) poster_.post(board_address(id), id, e->failure());
      }
    } else if (std::optional<RankId> dead = prefill_ && !r.early_failure ? prefill_->dead_destination(id) : std::nullopt) {
      // A sender not init()ed yet whose destination died: its metadata can no longer come. It
      // fails now (origin the dead rank), as an initialized room bound for it did.
      const Failure f{ErrorCode::kPeerUnreachable, *dead, fmt::format("{} is down", dead->str()), now, 0};
      if (!open_sender_for_failure(id, r, f, false)) r.early_failure = KVTransferError::from(id, f, true);
    } else if (prefill_ && !r.early_failure &&
               now - r.metrics.created_ns > config_.deadlines.bootstrap_timeout_ms * 1'000'000) {
      // A sender never init()ed (SGLang inits once decode's metadata is here): its bootstrap
      // deadline counts from its creation, as an initialized room's does.
      const Failure f{ErrorCode::kBootstrapTimeout, self(),
                      prefill_->metadata_complete(id)
                          ? fmt::format("decode's metadata came, but the sender was not init()ed within {} ms",
                                        config_.deadlines.bootstrap_timeout_ms)
                          : fmt::format("decode's metadata did not come within {} ms (the sender was not init()ed)",
                                        config_.deadlines.bootstrap_timeout_ms),
                      now, 0};
      if (!open_sender_for_failure(id, r, f, true)) r.early_failure = KVTransferError::from(id, f, false);
    } else if (r.early_failure) {
      log_failure_once(id, r);
      if (!r.posted) {
        r.posted = true;
        if (!r.early_failure->is_from_another_rank) {
          Failure f = r.early_failure->failure();  // observed here: its wall clock is this host's
          if (f.wall_ns == 0) f.wall_ns = wall_from_monotonic(f.first_seen_ns);
          poster_.post(board_address(id), id, f);
        } else if (r.early_failure->wall_ns != 0) {
          poster_.post(board_address(id), id, r.early_failure->failure());  // as a peer stamped it
        }
      }
    }
    if (r.dropped && release_safe_locked(id, r, now)) {
      if (r.initialized) {
        if (prefill_) {
          prefill_->release(id);
        } else {
          const ReceiverRoom* rr = r.ep->room(id);
          bool quarantined = false;
          if (rr && rr->failed_ns != 0)
            for (const RankId& src : rr->metadata_sent)
              if (!rr->terminal.count(src)) {
                ++quarantined_rooms_;
                quarantined = true;
                break;
              }
          r.ep->release(id);
          // A receiver dropped while a write could land: its engine waits for the room's name
          // (take_reclaimed_rooms); a quarantined one is named when its quarantine ends.
          if (r.dropped_unsafe && !quarantined && reclaimed_dropped_.size() < kMaxReclaimedDropped)
            reclaimed_dropped_.push_back(id);
        }
        if (core_->faults()) core_->faults()->clear_room(id);
      }
      if (!r.instance.empty()) room_left(r.instance, now);
      it = rooms_.erase(it);
      continue;
    }
    ++it;
  }
}

std::string ManagerImpl::board_address(uint64_t room) const {
  std::lock_guard lock(mu_);
  if (prefill_) return config_.bootstrap_address;
  auto it = rooms_.find(room);
  return it == rooms_.end() ? std::string() : it->second.instance;
}

std::optional<Failure> ManagerImpl::look_up_failure(uint64_t room, int64_t wait_ms) {
  const std::string address = board_address(room);
  if (address.empty()) return std::nullopt;
  const bool waits = wait_ms > 0;  // an agreement-only rank's wait (not the one look of a failed room)
  int64_t now = monotonic_ns();
  if (now < board_quiet_until_ns_.load()) wait_ms = std::min<int64_t>(wait_ms, kBoardQuietWaitMs);
  wait_ms = std::max<int64_t>(wait_ms, 0);
  const int64_t deadline = now + wait_ms * 1'000'000;
  int64_t pause_ms = 1;
  bool answered = false;
  for (;;) {
    // Each try of a wait is bounded by what is left of it (at least kBoardTryMinMs, at most 1 s):
    // a board that does not answer holds the caller about wait_ms, not a fixed floor per try.
    const int64_t left_ms = std::max<int64_t>(0, (deadline - monotonic_ns()) / 1'000'000);
    const int64_t try_ms = waits ? std::clamp<int64_t>(left_ms, kBoardTryMinMs, 1000) : kBoardLookMs;
    BootstrapClient client(address, static_cast<int>(try_ms));
    Result<std::optional<Failure>> r = client.lookup_failure(room);
    if (r.ok() && *r) {
      if (waits) {  // records come for rooms this rank waits for: full waits again
        vain_lookups_.store(0);
        board_quiet_until_ns_.store(0);
      }
      return **r;
    }
    if (r.ok()) {
      answered = true;
    } else {
      // Not an answer (a timeout on a loaded host, a refused connection while the service
      // restarts): asked again until the wait is over, as a missing record is. A refusal of this
      // rank's secret (401/403) will not change: no more tries.
      log_event(LogLevel::kDebug, "manager",
                fmt::format("room {}: the failure board at {} did not answer: {}", room, address, r.status().str()),
                {.room = room});
      if (bootstrap::not_authorized(r.status())) break;
    }
    now = monotonic_ns();
    if (now + pause_ms * 1'000'000 > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    pause_ms = std::min<int64_t>(pause_ms * 2, 16);
  }
  // A wait in vain: a board that never answered, or kVainLookupsBeforeQuiet waits in a row whose
  // record never came (an engine whose failures are never posted), shortens the next waits; one
  // vain wait alone does not (a post that was merely late on a busy host).
  if (waits && wait_ms > kBoardQuietWaitMs &&
      (!answered || vain_lookups_.fetch_add(1) + 1 >= kVainLookupsBeforeQuiet))
    board_quiet_until_ns_.store(monotonic_ns() + kBoardQuietNs);
  return std::nullopt;
}

std::vector<uint64_t> ManagerImpl::take_reclaimed_rooms() {
  std::lock_guard lock(mu_);
  if (!decoding_) return {};
  std::vector<uint64_t> out;
  for (auto& [address, inst] : instances_) {
    std::vector<uint64_t> some = inst.ep->take_reclaimed();
    out.insert(out.end(), some.begin(), some.end());
  }
  out.insert(out.end(), reclaimed_dropped_.begin(), reclaimed_dropped_.end());
  reclaimed_dropped_.clear();
  return out;
}

ManagerStats ManagerImpl::stats() const {
  std::lock_guard lock(mu_);
  ManagerStats s;
  s.leaving = leaving_;
  s.live_rooms = live_rooms_locked();
  if (prefill_) {
    s.peers = prefill_->peers();
    s.decode_instances = prefill_->decode_instances();
    s.forgotten_decode_instances = prefill_->forgotten_decode_instances();
  }
  s.quarantined_rooms = quarantined_rooms_;
  if (decoding_) {
    s.reclaimed_rooms = forgotten_reclaimed_;
    s.forgotten_prefill_instances = forgotten_instances_;
    for (const auto& [address, inst] : instances_) {
      const DecodeEndpoint& ep = *inst.ep;
      s.peers += ep.peers();
      s.quarantined_pages += ep.quarantined_pages();
      s.reclaimed_rooms += ep.reclaimed_total();
      s.prefill_instances.push_back({address, inst.rooms, ep.peers(), ep.dead_sources(), ep.quarantined_rooms(),
                                     ep.quarantined_pages()});
      s.heartbeats_sent += ep.own_monitor_stats().heartbeats_sent;  // 0 without its own monitor
    }
  }
  s.failure_records = core_->registry().records();
  if (prefill_) s.aux_rows_in_use = prefill_->aux_in_use();
  const IncarnationCounts& inc = core_->incarnation_counts();
  s.stale_registrations = inc.stale_registrations;
  s.stale_metadata = inc.stale_metadata;
  s.stale_statuses = inc.stale_statuses;
  s.stale_heartbeats = inc.stale_heartbeats;
  s.peer_restarts = inc.peer_restarts;
  for (size_t k = 0; k < kRefusalKinds; ++k)
    s.refusals.emplace_back(std::string(refusal_name(static_cast<Refusal>(k))),
                            core_->refusals().count(static_cast<Refusal>(k)));
  s.refusals.emplace_back("foreign", prefill_ ? prefill_->foreign_messages() : 0);
  s.transport = core_->transport().stats();
  const ControlSocket::Counters cc = core_->control().counters();
  s.control_frames_sent = cc.frames_sent;
  s.control_bytes_sent = cc.bytes_sent;
  s.control_frames_received = cc.frames_received;
  s.control_bytes_received = cc.bytes_received;
  s.heartbeats_sent += core_->monitor().stats().heartbeats_sent + forgotten_heartbeats_;
  return s;
}

}  // namespace kvferry
