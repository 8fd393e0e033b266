#include "driver/decode_driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

#include "driver/metrics_hooks.h"
#include "driver/room_faults.h"
#include "driver/sibling_fanout.h"
#include "kvferry/content.h"
#include "kvferry/log.h"
#include "manager/log_policy.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.driver";
}

DecodeDriver::DecodeDriver(Manager& manager, DecodeDriverConfig config)
    : manager_(manager), cfg_(config), pages_(manager.layout().num_pages), aux_(manager.layout().aux_slots) {}

DecodeDriver::~DecodeDriver() = default;

void DecodeDriver::apply(const Decision& d) {
  const RankId self = manager_.self();
  switch (d.op) {
    case Decision::Op::kNew: {
      if (rooms_.count(d.room)) return;
      Room& r = rooms_[d.room];
      r.req = d.request;
      r.pages_needed = manager_.layout().pages_for(d.request.input_tokens);
      r.created_ns = monotonic_ns();
      auto receiver = manager_.receiver(d.room, d.request.prefill_bootstrap);
      if (!receiver.ok()) {
        r.local_failure = KVTransferError{d.room, ErrorCode::kInternal, "receiver() refused: " + receiver.status().str(),
                                          self, false, monotonic_ns()};
      } else {
        r.handle = std::move(*receiver);
        Status s = r.handle->init();  // the prefill DP group by the room (kvferry/routing.h)
        if (!s.ok()) r.handle->fail(ErrorCode::kInternal, "init() refused: " + s.str());
      }
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
        fail_room(r, ErrorCode::kInternal, "page allocators of the engine's ranks diverged", self);
        return;
      }
      r.admitted = true;
      r.kv_indices = std::move(*kv);
      r.aux_slot = (*slot)[0];
      if (!r.handle) return;
      const RoomFaults faults(r.req.fault, self);
      if (faults.fail_here()) {
        r.handle->fail(ErrorCode::kInjected, "injected decode failure (replay fault plan)");
        return;
      }
      if (faults.silent_toward(r.handle->peers())) return;  // a source must time out waiting for us
      Status s = r.handle->send_metadata(r.kv_indices, *r.aux_slot, {}, r.req.input_tokens);
      if (!s.ok()) r.handle->fail(ErrorCode::kInternal, "send_metadata() refused: " + s.str());
      if (faults.peers_silent()) r.fault_deadline_ns = monotonic_ns() + cfg_.fault_timeout_ms * 1'000'000;
      return;
    }
    case Decision::Op::kFail: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end()) return;
      apply_engine_failure(it->second, d, self);
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
      // This rank's receiver may need no quarantine (its sources confirmed by now): the room is
      // then reclaimed here already and waits only for the other ranks.
      if (keep) quarantine(d.room, r, r.handle && r.handle->quarantined());
      rooms_.erase(it);  // drops the receiver: the manager releases the room
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

void DecodeDriver::quarantine(uint64_t room, Room& r, bool quarantined_here) {
  quarantined_ += r.kv_indices.size();
  ++quarantined_aux_;
  // A room id quarantined twice: the older pages stay quarantined for good (still counted).
  if (quarantine_.erase(room)) std::erase(quarantine_order_, room);
  quarantine_[room] = {std::move(r.kv_indices), *r.aux_slot, !quarantined_here};
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
    rep.tp_rank = manager_.self().tp_rank;
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
    if (r.reclaimed && r.tp_rank < cfg_.tp_size) ranks.insert(r.tp_rank);
  if (ranks.size() == cfg_.tp_size) out->push_back({Decision::Op::kReclaim, room});
}

void DecodeDriver::log_release(uint64_t room, const Room& r, const Decision& release) {
  if (!r.fail_decided) {
    log_event(LogLevel::kDebug, kComp,
              fmt::format("room released after success ({} bytes verified)", r.verified), {.room = room});
    const TransferMetrics m = r.handle ? r.handle->metrics() : TransferMetrics{};
    double latency = m.done_ns && m.metadata_ns ? double(m.done_ns - m.metadata_ns) / 1e9 : -1;
    metrics_on_release({.latency_s = latency, .verified_bytes = r.verified, .mismatched_bytes = r.mismatched});
    return;
  }
  // The engine's root cause as the leader released the room (older leaders: the kFail decision).
  const Failure root = failure_of(release.code != ErrorCode::kOk ? release : r.failure);
  const FailureLine line =
      failure_release_line(Role::kDecode, room, root, own_failure(room_failure(r), manager_.self()));
  log_event(line.level, kComp, line.msg, line.fields);
  const bool from_another = line.is_from_another_rank;
  const Decision& f = release.code != ErrorCode::kOk ? release : r.failure;
  metrics_on_release({.failed = true, .code = f.code, .from_another_rank = from_another,
                      .verified_bytes = r.verified, .mismatched_bytes = r.mismatched});
}

void DecodeDriver::start_verify(uint64_t room, Room& r) {
  r.verify_started = true;
  const PoolLayout* layout = &manager_.layout();
  const uint8_t* base = manager_.pool_base();
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
    fail_room(it->second, ErrorCode::kInternal, "verify worker: " + what, manager_.self());
  });
}

void DecodeDriver::pump(int64_t now_ns) {
  verifier_.drain();
  for (uint64_t id : manager_.take_reclaimed_rooms()) {
    auto q = quarantine_.find(id);
    if (q != quarantine_.end()) q->second.reclaimed_here = true;
  }
  const RankId self = manager_.self();
  for (auto& [id, r] : rooms_) {
    if (!r.handle || r.verify_started) continue;
    const KVPoll p = r.handle->poll();
    if (r.fault_deadline_ns != 0 && now_ns >= r.fault_deadline_ns) {
      r.fault_deadline_ns = 0;
      if (p != KVPoll::Success && p != KVPoll::Failed) {
        r.handle->fail(ErrorCode::kWaitingTimeout,
                       fmt::format("no data from the room's prefill sources within {} ms of sending the metadata "
                                   "(the request's timeout fault)",
                                   cfg_.fault_timeout_ms));
        continue;
      }
    }
    if (p != KVPoll::Success) continue;
    if (RoomFaults(r.req.fault, self).fail_transfer()) {
      r.handle->fail(ErrorCode::kTransferError, "injected transfer error at the receiver (replay fault plan)");
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
    rep.tp_rank = manager_.self().tp_rank;
    std::optional<KVTransferError> e = room_failure(r);
    KVPoll p = e ? KVPoll::Failed : r.handle->poll();
    const bool succeeded = p == KVPoll::Success;
    if (succeeded && !r.verify_done) p = KVPoll::Transferring;
    rep.poll = p;
    const bool verifying = r.verify_started && !r.verify_done;
    const bool drained = (!r.handle || r.handle->release_safe()) && !verifying;
    rep.drained = drained;
    const TransferMetrics m = r.handle ? r.handle->metrics() : TransferMetrics{};
    if (e) {
      report_failure(rep, *e);
      rep.failed_ns = m.failed_ns ? m.failed_ns : (r.failed_ns ? r.failed_ns : now_ns);
      rep.quarantine = drained && r.handle && r.handle->quarantined();
    }
    if (succeeded) rep.success_ns = m.done_ns;
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
  const RankId self = manager_.self();
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
    if (r.admitted || r.fail_decided || room_failure(r)) continue;
    if (now_ns - r.created_ns > cfg_.prealloc_timeout_ms * 1'000'000) {
      out.push_back(local_failure(
          id, ErrorCode::kPreallocTimeout,
          fmt::format("{} pages did not become free within {} ms ({} of {} free)", r.pages_needed,
                      cfg_.prealloc_timeout_ms, pages_.free_pages(), pages_.total_pages()),
          self));
      r.fail_decided = true;
      continue;
    }
    if (r.pages_needed > pages_.total_pages()) {
      const PoolLayout& l = manager_.layout();
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
  return collect_fan_out(rooms_, manager_.self());
}

bool DecodeDriver::on_sibling_failure(const SiblingFailure& f) { return apply_sibling_failure(rooms_, f, kComp); }

RankLeakStats DecodeDriver::leak_stats() const {
  const ManagerStats m = manager_.stats();
  RankLeakStats s = leak_stats_of(manager_.self(), m);
  s.live_rooms = m.live_rooms + rooms_.size();
  s.pages_in_use = pages_.in_use() - quarantined_ + aux_.in_use() - quarantined_aux_;
  s.quarantined_pages = quarantined_ + quarantined_aux_;  // leaked: counted apart, not hidden
  s.reclaimed_pages = reclaimed_pages_;
  return s;
}

}  // namespace kvferry
