#include "driver/engine.h"

#include <algorithm>
#include <string>
#include <utility>

namespace kvferry {

namespace {
template <typename T>
Failure record_of(const T& x) {
  return Failure{x.code, RankId::parse(x.origin).value_or(RankId{}), x.reason, x.first_seen_ns, x.wall_ns};
}
}  // namespace

Failure failure_of(const RoomReport& r) { return record_of(r); }
Failure failure_of(const Decision& d) { return record_of(d); }
Failure failure_of(const SiblingFailure& f) { return record_of(f); }

void set_failure(Decision& d, const Failure& f) {
  d.code = f.code;
  d.origin = f.origin.str();
  d.reason = f.reason;
  d.first_seen_ns = f.first_seen_ns;
  d.wall_ns = f.wall_ns;
}

Decision local_failure(uint64_t room, ErrorCode code, std::string reason, const RankId& self) {
  Decision d;
  d.op = Decision::Op::kFail;
  d.room = room;
  d.code = code;
  d.origin = self.str();
  d.reason = std::move(reason);
  d.first_seen_ns = monotonic_ns();
  d.wall_ns = wall_from_monotonic(d.first_seen_ns);
  d.observed_by_leader = true;
  return d;
}

void EngineDriver::new_and_aborts(std::vector<RouterRequest>& new_requests, const RankId& self,
                                  const std::function<bool*(uint64_t)>& fail_decided, std::vector<Decision>* out) {
  for (RouterRequest& req : new_requests) {
    Decision d;
    d.op = Decision::Op::kNew;
    d.room = req.room;
    d.request = std::move(req);
    out->push_back(std::move(d));
  }
  std::vector<uint64_t> later;
  for (uint64_t id : aborts_) {
    bool* flag = fail_decided(id);
    if (!flag) {
      for (const Decision& n : *out)
        if (n.op == Decision::Op::kNew && n.room == id) later.push_back(id);
      continue;
    }
    if (*flag) continue;
    out->push_back(local_failure(id, ErrorCode::kAborted, "aborted by the router", self));
    *flag = true;
  }
  aborts_ = std::move(later);
}

EngineDriver::Verdict EngineDriver::room_verdict(uint64_t room, const std::vector<RoomReport>& reps,
                                                 const RoomReduction& red, bool* fail_decided,
                                                 std::vector<Decision>* out) const {
  if (!*fail_decided) {
    std::optional<Decision> d = down_rank_failure(room);
    if (!d && red.any_failure) {
      d = Decision{};
      d->op = Decision::Op::kFail;
      d->room = room;
      set_failure(*d, failure_of(red.winner));
    }
    if (d) {
      out->push_back(*d);
      *fail_decided = true;  // apply() repeats this on every rank
      return Verdict::kFailDecided;
    }
  }
  if (!red.any_failure && red.min_poll == KVPoll::Success && red.all_drained) return Verdict::kDoneOk;
  if (*fail_decided && red.ranks_failed == reps.size() && red.all_drained) return Verdict::kDoneFailed;
  return Verdict::kPending;
}

RoomResult& EngineDriver::release_room(uint64_t room, Role role, bool ok, const RoomReduction& red,
                                       std::vector<Decision>* out, std::vector<RoomResult>* results) const {
  Decision rel;
  rel.op = Decision::Op::kRelease;
  rel.room = room;
  rel.quarantine = red.any_quarantine;
  if (!ok && red.any_failure) set_failure(rel, failure_of(red.winner));
  out->push_back(rel);
  RoomResult res;
  res.role = role;
  res.room = room;
  res.state = ok ? KVPoll::Success : KVPoll::Failed;
  res.ranks_failed = red.ranks_failed;
  res.ranks_lost = static_cast<uint32_t>(down_ranks_.size());
  if (!ok) {
    res.code = red.winner.code;
    res.origin = red.winner.origin;
    res.reason = red.winner.reason;
    res.first_failed_ns = red.winner.first_seen_ns;
    res.first_failed_wall_ns = red.winner.wall_ns;
    res.failed_all_ns = red.max_failed_ns;
  }
  results->push_back(std::move(res));
  return results->back();
}

RoomReduction reduce_room(const std::vector<RoomReport>& reports) {
  RoomReduction out;
  for (const RoomReport& r : reports) {
    out.min_poll = static_cast<KVPoll>(std::min(static_cast<int>(out.min_poll), static_cast<int>(r.poll)));
    out.all_drained = out.all_drained && r.drained;
    out.any_quarantine = out.any_quarantine || r.quarantine;
    if (r.poll == KVPoll::Failed) {
      ++out.ranks_failed;
      out.max_failed_ns = std::max(out.max_failed_ns, r.failed_ns);
    }
    if (r.has_failure) {
      // The root-cause rule: the same winner whatever order the ranks' reports come in.
      bool better = !out.any_failure || failure_precedes(failure_of(r), failure_of(out.winner)) ||
                    (failure_of(r) == failure_of(out.winner) && r.tp_rank < out.winner.tp_rank);
      if (better) out.winner = r;
      out.any_failure = true;
    }
    if (r.send_ns != 0 && (out.min_send_ns == 0 || r.send_ns < out.min_send_ns)) out.min_send_ns = r.send_ns;
    out.max_success_ns = std::max(out.max_success_ns, r.success_ns);
    out.max_compute_end_ns = std::max(out.max_compute_end_ns, r.compute_end_ns);
    out.bytes += r.bytes;
    out.verified += r.verified;
    out.mismatched += r.mismatched;
  }
  if (reports.empty()) out.min_poll = KVPoll::Bootstrapping;
  return out;
}

}  // namespace kvferry
