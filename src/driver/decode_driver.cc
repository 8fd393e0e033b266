#include "driver/decode_driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

#include "manager/log_policy.h"
#include "manager/manager_internal.h"
#include "driver/metrics_hooks.h"
#include "driver/room_faults.h"
#include "driver/sibling_fanout.h"
#include "kvferry/content.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.driver";
}

DecodeDriver::DecodeDriver(Manager& manager)
    : core_(internal(manager).core()), ep_(*internal(manager).decode()), pages_(core_.layout().num_pages),
      aux_(core_.layout().aux_slots), verifier_(core_.waker()), tp_size_(internal(manager).config().tp_size) {}

DecodeDriver::~DecodeDriver() = default;

void DecodeDriver::apply(const Decision& d) {
  const RankId self = core_.self();
  switch (d.op) {
    case Decision::Op::kNew: {
      if (rooms_.count(d.room)) return;
      Room& r = rooms_[d.room];
      r.req = d.request;
      r.pages_needed = core_.layout().pages_for(d.request.input_tokens);
      r.created_ns = monotonic_ns();
      ep_.add_room(d.room, d.request.input_tokens);
      if (self.tp_rank == 0) prealloc_.push_back(d.room);
      log_event(LogLevel::kDebug, kComp, fmt::format("receiver created ({} pages)", r.pages_needed), {.room = d.room});
      return;
    }
    case Decision::Op::kAdmit: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end() || it->second.admitted) return;
      Room& r = it->second;
      auto kv = pages_.alloc(r.pages_needed);
      auto slot = aux_.alloc(1);
      if (!kv || !slot) {  // the ranks' allocators diverged: a bug, fail the room loudly
        if (kv) pages_.free(*kv);
        if (slot) aux_.free(*slot);
        ep_.fail(d.room, ErrorCode::kInternal, "page allocators of the engine's ranks diverged", self, monotonic_ns(), true);
        return;
      }
      r.admitted = true;
      r.kv_indices = std::move(*kv);
      r.aux_slot = (*slot)[0];
      const RoomFaults faults(r.req.fault, self);
      if (faults.fail_here()) {
        ep_.fail(d.room, ErrorCode::kInjected, "injected decode failure (replay fault plan)", self, monotonic_ns(), true);
        return;
      }
      if (const ReceiverRoom* rr = ep_.room(d.room); rr && faults.silent_toward(rr->sources))
        return;  // a source must time out waiting for us
      Status s = ep_.init(d.room, r.kv_indices, static_cast<uint32_t>(*r.aux_slot));
      if (!s.ok()) ep_.fail(d.room, ErrorCode::kInternal, "init() refused: " + s.str(), self, monotonic_ns(), true);
      if (faults.peers_silent())
        ep_.set_waiting_deadline(d.room, monotonic_ns() + core_.config().deadlines.fault_timeout_ms * 1'000'000);
      return;
    }
    case Decision::Op::kFail: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end()) return;
      auto origin = RankId::parse(d.origin);
      const RankId leader{self.role, self.engine_id, 0, self.dp_rank};
      Failure f = failure_of(d);
      f.origin = origin ? *origin : self;
      ep_.fail(d.room, f, d.observed_by_leader && d.origin == self.str(), self.tp_rank != 0 ? &leader : nullptr);
      if (it->second.failed_ns == 0) it->second.failed_ns = monotonic_ns();
      it->second.failure = d;
      it->second.fail_decided = true;
      return;
    }
    case Decision::Op::kRelease: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end()) return;
      Room& r = it->second;
      log_release(d.room, r, d);
      // Pages and aux row by the same rule: a late prefill write may still land in either.
      const bool keep = r.admitted && d.quarantine;
      if (r.admitted && !keep) {
        pages_.free(r.kv_indices);
        aux_.free({*r.aux_slot});
      }
      ep_.release(d.room);  // the endpoint starts its own quarantine of the room, if it needs one
      if (keep) quarantine(d.room, r);
      rooms_.erase(it);
      std::erase(prealloc_, d.room);
      return;
    }
    case Decision::Op::kReclaim:
      reclaim(d.room);
      return;
    case Decision::Op::kStart:
      return;  // prefill only
  }
}

void DecodeDriver::quarantine(uint64_t room, Room& r) {
  quarantined_ += r.kv_indices.size();
  ++quarantined_aux_;
  // A room id quarantined twice: the older pages stay quarantined for good (still counted).
  if (quarantine_.erase(room)) std::erase(quarantine_order_, room);
  // This rank's endpoint may need no quarantine at all (its sources confirmed by the release):
  // then the room is reclaimed here already, and waits only for the other ranks.
  quarantine_[room] = {std::move(r.kv_indices), *r.aux_slot, !ep_.is_quarantined(room)};
  quarantine_order_.push_back(room);
  while (quarantine_order_.size() > kMaxQuarantinedRooms) {
    quarantine_.erase(quarantine_order_.front());  // every rank drops the same room: lockstep
    quarantine_order_.pop_front();
  }
}

void DecodeDriver::reclaim(uint64_t room) {
  auto it = quarantine_.find(room);
  if (it == quarantine_.end()) return;
  const Quarantined& q = it->second;
  pages_.free(q.kv_indices);
  aux_.free({q.aux_slot});
  quarantined_ -= q.kv_indices.size();
  --quarantined_aux_;
  reclaimed_pages_ += q.kv_indices.size() + 1;
  ++reclaimed_rooms_;
  log_event(LogLevel::kDebug, kComp,
            fmt::format("quarantine ended on every rank of the engine: {} pages and the aux row reclaimed",
                        q.kv_indices.size()),
            {.room = room});
  quarantine_.erase(it);
  std::erase(quarantine_order_, room);
}

std::vector<RoomReport> DecodeDriver::reclaim_reports() const {
  std::vector<RoomReport> out;
  for (const auto& [id, q] : quarantine_) {
    if (!q.reclaimed_here) continue;
    RoomReport rep;
    rep.room = id;
    rep.tp_rank = core_.self().tp_rank;
    rep.reclaimed = true;
    out.push_back(rep);
  }
  return out;
}

void DecodeDriver::decide_reclaim(uint64_t room, const std::vector<RoomReport>& reps,
                                  std::vector<Decision>* out) const {
  if (!quarantine_.count(room)) return;
  std::set<uint32_t> ranks;
  for (const RoomReport& r : reps)
    if (r.reclaimed && r.tp_rank < tp_size_) ranks.insert(r.tp_rank);
  if (ranks.size() == tp_size_) out->push_back({Decision::Op::kReclaim, room});
}

void DecodeDriver::log_release(uint64_t room, const Room& r, const Decision& release) {
  if (!r.fail_decided) {
    log_event(LogLevel::kDebug, kComp,
              fmt::format("room released after success ({} bytes verified)", r.verified), {.room = room});
    const ReceiverRoom* rr = ep_.room(room);
    double latency = rr && rr->success_ns && rr->init_ns ? double(rr->success_ns - rr->init_ns) / 1e9 : -1;
    metrics_on_release({.latency_s = latency, .verified_bytes = r.verified, .mismatched_bytes = r.mismatched});
    return;
  }
  // The engine's root cause as the leader released the room (older leaders: the kFail decision).
  const Failure root = failure_of(release.code != ErrorCode::kOk ? release : r.failure);
  const FailureLine line = failure_release_line(Role::kDecode, room, root, core_.registry().own(room));
  log_event(line.level, kComp, line.msg, line.fields);
  const bool from_another = line.is_from_another_rank;
  const Decision& f = release.code != ErrorCode::kOk ? release : r.failure;
  metrics_on_release({.failed = true, .code = f.code, .from_another_rank = from_another,
                      .verified_bytes = r.verified, .mismatched_bytes = r.mismatched});
}

void DecodeDriver::start_verify(uint64_t room, Room& r) {
  r.verify_started = true;
  const PoolLayout* layout = &core_.layout();
  const uint8_t* base = core_.base();
  std::vector<uint64_t> kv = r.kv_indices;
  verifier_.submit([this, layout, base, room, kv = std::move(kv)]() -> JobWorker::Completion {
    uint64_t checked = 0, bad = 0;
    const uint32_t nb = layout->num_buffers();
    for (size_t i = 0; i < kv.size(); ++i) {
      uint64_t first_token = i * layout->page_size;
      for (uint32_t b = 0; b < nb; ++b) {
        bad += verify_page(*layout, room, b, first_token, base + layout->page_offset(b, kv[i]));
        checked += layout->page_bytes();
      }
    }
    return [this, room, checked, bad] {
      auto it = rooms_.find(room);
      if (it == rooms_.end()) return;
      it->second.verify_done = true;
      it->second.verified = checked;
      it->second.mismatched = bad;
      log_event(bad ? LogLevel::kDebug : LogLevel::kTrace, kComp,
                fmt::format("verified {} bytes, {} mismatched", checked, bad), {.room = room});
    };
  }, [this, room](const std::string& what) {
    auto it = rooms_.find(room);
    if (it == rooms_.end()) return;
    it->second.verify_done = true;
    ep_.fail(room, ErrorCode::kInternal, "verify worker: " + what, core_.self(), monotonic_ns(), true);
  });
}

void DecodeDriver::pump(int64_t now_ns) {
  verifier_.drain();
  ep_.tick(now_ns);
  for (uint64_t id : ep_.take_reclaimed()) {
    auto q = quarantine_.find(id);
    if (q != quarantine_.end()) q->second.reclaimed_here = true;
  }
  const RankId self = core_.self();
  for (auto& [id, r] : rooms_) {
    if (r.verify_started || ep_.poll(id) != KVPoll::Success || core_.registry().get(id)) continue;
    if (RoomFaults(r.req.fault, self).fail_transfer()) {
      ep_.fail(id, ErrorCode::kTransferError, "injected transfer error at the receiver (replay fault plan)", self,
               now_ns, true);
      continue;
    }
    start_verify(id, r);
  }
}

std::vector<RoomReport> DecodeDriver::reports(int64_t now_ns) {
  std::vector<RoomReport> out;
  out.reserve(rooms_.size());
  for (auto& [id, r] : rooms_) {
    RoomReport rep;
    rep.room = id;
    rep.tp_rank = core_.self().tp_rank;
    const ReceiverRoom* rr = ep_.room(id);
    auto e = core_.registry().get(id);
    KVPoll p = ep_.poll(id);
    if (e) p = KVPoll::Failed;
    else if (p == KVPoll::Success && !r.verify_done) p = KVPoll::Transferring;
    rep.poll = p;
    bool verifying = r.verify_started && !r.verify_done;
    bool drained = ep_.drained(id, now_ns) && !verifying;
    rep.drained = drained;
    if (e) {
      rep.has_failure = true;
      rep.code = e->code;
      rep.origin = e->origin.str();
      rep.reason = e->failure_reason;
      rep.first_seen_ns = e->first_seen_ns;
      rep.wall_ns = e->wall_ns;
      rep.failed_ns = rr && rr->failed_ns ? rr->failed_ns : (r.failed_ns ? r.failed_ns : now_ns);
      if (rr && drained) {
        for (const RankId& src : rr->metadata_sent)
          if (!rr->terminal.count(src)) rep.quarantine = true;
      }
    }
    if (rr) rep.success_ns = rr->success_ns;
    rep.verified = r.verified;
    rep.mismatched = r.mismatched;
    out.push_back(std::move(rep));
  }
  return out;
}

std::vector<Decision> DecodeDriver::decide(const std::map<uint64_t, std::vector<RoomReport>>& by_room,
                                           std::vector<RouterRequest> new_requests, int64_t now_ns,
                                           std::vector<RoomResult>* results) {
  std::vector<Decision> out;
  const RankId self = core_.self();
  new_and_aborts(new_requests, self, [this](uint64_t id) -> bool* {
    auto it = rooms_.find(id);
    return it == rooms_.end() ? nullptr : &it->second.fail_decided;
  }, &out);
  for (const auto& [id, all] : by_room) {
    // Reports of a quarantined room's reclaim (not a live room's): kReclaim once every rank has.
    const std::vector<RoomReport>* live = &all;
    std::vector<RoomReport> filtered;
    if (std::any_of(all.begin(), all.end(), [](const RoomReport& r) { return r.reclaimed; })) {
      decide_reclaim(id, all, &out);
      std::copy_if(all.begin(), all.end(), std::back_inserter(filtered), [](const RoomReport& r) { return !r.reclaimed; });
      live = &filtered;
    }
    const std::vector<RoomReport>& reps = *live;
    auto it = rooms_.find(id);
    if (it == rooms_.end() || reps.empty()) continue;
    Room& r = it->second;
    RoomReduction red = reduce_room(reps);
    Verdict v = room_verdict(id, reps, red, &r.fail_decided, &out);
    bool done_ok = v == Verdict::kDoneOk, done_failed = v == Verdict::kDoneFailed;
    if (!done_ok && !done_failed) continue;
    RoomResult& res = release_room(id, Role::kDecode, done_ok, red, &out, results);
    res.success_ns = red.max_success_ns;
    res.bytes_verified = red.verified;
    res.bytes_mismatched = red.mismatched;
    res.rejected = done_failed && red.winner.code == ErrorCode::kResourceExhausted && red.winner.origin == self.str();
  }
  // Preallocation queue, FIFO: admit while the head fits; reject what can never fit.
  uint64_t free_pages = pages_.free_pages();
  uint64_t free_aux = aux_.free_pages();
  std::deque<uint64_t> keep;
  bool blocked = false;
  for (uint64_t id : prealloc_) {
    auto it = rooms_.find(id);
    if (it == rooms_.end()) continue;
    Room& r = it->second;
    if (r.admitted || r.fail_decided || core_.registry().get(id)) continue;
    if (now_ns - r.created_ns > core_.config().deadlines.prealloc_timeout_ms * 1'000'000) {
      out.push_back(local_failure(
          id, ErrorCode::kPreallocTimeout,
          fmt::format("{} pages did not become free within {} ms ({} of {} free)", r.pages_needed,
                      core_.config().deadlines.prealloc_timeout_ms, pages_.free_pages(), pages_.total_pages()),
          self));
      r.fail_decided = true;
      continue;
    }
    if (r.pages_needed > pages_.total_pages()) {
      const PoolLayout& l = core_.layout();
      Decision d;
      d.op = Decision::Op::kFail;
      d.room = id;
      d.code = ErrorCode::kResourceExhausted;
      d.origin = self.str();
      d.observed_by_leader = true;  // local here: the one warning line README promises
      d.first_seen_ns = monotonic_ns();
      d.reason = fmt::format(
          "request of {} tokens needs {} pages ({:.2f} GiB) per decode rank; the decode pool has {} pages "
          "({:.2f} GiB) per rank: it can never fit",
          r.req.input_tokens, r.pages_needed, double(l.bytes_for_pages(r.pages_needed)) / (1u << 30), l.num_pages,
          double(l.bytes_for_pages(l.num_pages)) / (1u << 30));
      out.push_back(d);
      r.fail_decided = true;
      continue;
    }
    if (!blocked && r.pages_needed <= free_pages && free_aux > 0) {
      free_pages -= r.pages_needed;
      --free_aux;
      out.push_back({Decision::Op::kAdmit, id});
      continue;
    }
    blocked = true;
    keep.push_back(id);
  }
  prealloc_ = std::move(keep);
  return out;
}

std::vector<SiblingFailure> DecodeDriver::take_failures_to_fan_out() {
  return collect_fan_out(rooms_, ep_, core_);
}

bool DecodeDriver::on_sibling_failure(const SiblingFailure& f) {
  return apply_sibling_failure(rooms_, ep_, core_, f, kComp);
}

RankLeakStats DecodeDriver::leak_stats() const {
  RankLeakStats s;
  s.rank = core_.self().str();
  s.live_rooms = ep_.live_rooms() + rooms_.size();
  s.records = core_.registry().records();
  s.pages_in_use = pages_.in_use() - quarantined_ + aux_.in_use() - quarantined_aux_;
  s.quarantined_pages = quarantined_ + quarantined_aux_;  // leaked: counted apart, not hidden
  s.reclaimed_pages = reclaimed_pages_;
  s.peers = ep_.peers();
  const IncarnationCounts& inc = core_.incarnation_counts();
  s.stale_messages = {inc.stale_registrations, inc.stale_metadata, inc.stale_statuses, inc.stale_heartbeats};
  s.peer_restarts = inc.peer_restarts;
  for (size_t k = 0; k < kRefusalKinds; ++k)
    s.refusals.push_back({std::string(refusal_name(static_cast<Refusal>(k))), core_.refusals().count(static_cast<Refusal>(k))});
  s.transport = core_.transport().stats();
  return s;
}

}  // namespace kvferry
