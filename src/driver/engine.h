// What the ranks of one engine exchange every step to agree on each room's state (docs/design.md §3
// "Propagation, within an engine"): each rank reports its rooms; the leader (tp0) reduces them
// (MIN over ranks, carrying the winning failure's origin) and decides; every rank applies the
// decisions in the same order. Decisions that allocate decode pages are applied in lockstep,
// so the ranks' allocators stay identical.
// Thread contract: value types; EngineDriver is used from the rank's main thread only.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "driver/engine_protocol.h"
#include "kvferry/error.h"
#include "kvferry/poll.h"

namespace kvferry {

// The reduction of one room over all ranks of an engine.
struct RoomReduction {
  KVPoll min_poll = KVPoll::Success;
  bool all_drained = true;
  bool any_quarantine = false;
  bool any_failure = false;
  RoomReport winner;  // the root cause by the rule (failure_precedes) over the ranks' failures
  uint32_t ranks_failed = 0;
  int64_t max_failed_ns = 0;
  int64_t min_send_ns = 0;
  int64_t max_compute_end_ns = 0;
  int64_t max_success_ns = 0;
  uint64_t bytes = 0;
  uint64_t verified = 0;
  uint64_t mismatched = 0;
};
RoomReduction reduce_room(const std::vector<RoomReport>& reports);

class EngineDriver {
 public:
  virtual ~EngineDriver() = default;
  // Applies one decision (every rank, in order).
  virtual void apply(const Decision& d) = 0;
  // Local work between steps (completions, scheduling, deadlines).
  virtual void pump(int64_t now_ns) = 0;
  // This rank's reports of every live room.
  virtual std::vector<RoomReport> reports(int64_t now_ns) = 0;
  // Decode: a report (RoomReport::reclaimed) of every quarantined room whose quarantine ended on
  // this rank and that awaits the engine's kReclaim; the whole set every step (bounded by the
  // driver's quarantine map), so a lost reply loses nothing. Not live rooms: not in reports().
  virtual std::vector<RoomReport> reclaim_reports() const { return {}; }
  // Leader only: decisions for the next step from every rank's reports (by room: reports() and
  // reclaim_reports()) and the router's new requests; results to send to the router for rooms
  // released by these decisions.
  virtual std::vector<Decision> decide(const std::map<uint64_t, std::vector<RoomReport>>& by_room,
                                       std::vector<RouterRequest> new_requests, int64_t now_ns,
                                       std::vector<RoomResult>* results) = 0;
  // Leader only: the router aborted `room` (the client went away); the next decide() fails it with
  // code aborted and this rank as origin.
  virtual void on_abort(uint64_t room) { aborts_.push_back(room); }
  // Leader only: a rank of this engine stopped answering (dead) / answers again (restarted).
  // While a rank is down, every room not yet failed fails with origin = that rank and code
  // peer_unreachable (a TP engine cannot serve a room without all its ranks).
  void on_rank_down(const RankId& rank, std::string reason) {
    down_ranks_[rank.str()] = {std::move(reason), monotonic_ns()};
  }
  void on_rank_up(const RankId& rank) { down_ranks_.erase(rank.str()); }
  virtual RankLeakStats leak_stats() const = 0;
  virtual bool idle() const = 0;  // no live rooms
  // Fds the rank's loop waits on besides the manager's: readable when the driver has local work
  // (a worker thread finished a job).
  virtual std::vector<int> wait_fds() const { return {}; }

  // The fan-out (SiblingFailure). Failures this rank recorded since the last call that its
  // siblings must be told: first-hand, or learned from the other engine; never those that came
  // from the agreement (a kFail) or from a sibling. Each room at most once.
  virtual std::vector<SiblingFailure> take_failures_to_fan_out() { return {}; }
  // A sibling's failure: the room fails here at once as a failure from another rank (its failed_ns
  // is set, it logs at debug only, the endpoint tells its peers in the other engine as for any
  // failure), unless the room already has a failure record here. Returns false if this rank does
  // not have the room (not created yet, or already released); then nothing changed.
  virtual bool on_sibling_failure(const SiblingFailure& /*f*/) { return false; }

 protected:
  // kNew decisions for the router's new requests, then kFail(aborted) for aborted rooms;
  // `fail_decided(room)` returns the room's flag (nullptr: unknown room). An abort of a room created
  // by this very batch waits for the next step.
  void new_and_aborts(std::vector<RouterRequest>& new_requests, const RankId& self,
                      const std::function<bool*(uint64_t)>& fail_decided, std::vector<Decision>* out);

  // What every engine decides for one room from its ranks' reports: kFail when a rank of the engine
  // is down or any rank reported a failure (once); then whether the room is done.
  enum class Verdict { kPending, kFailDecided, kDoneOk, kDoneFailed };
  Verdict room_verdict(uint64_t room, const std::vector<RoomReport>& reps, const RoomReduction& red,
                       bool* fail_decided, std::vector<Decision>* out) const;

  // kRelease for a done room (pages quarantined if any rank's drain deadline passed) and the
  // engine's RoomResult with the fields every engine fills; the caller adds its role's fields.
  // Ranks of the engine that are down count as lost (they report nothing any more).
  RoomResult& release_room(uint64_t room, Role role, bool ok, const RoomReduction& red,
                           std::vector<Decision>* out, std::vector<RoomResult>* results) const;

  // A kFail for `room` if a rank of this engine is down.
  std::optional<Decision> down_rank_failure(uint64_t room) const {
    if (down_ranks_.empty()) return std::nullopt;
    const auto& [rank, why] = *down_ranks_.begin();
    Decision d;
    d.op = Decision::Op::kFail;
    d.room = room;
    d.code = ErrorCode::kPeerUnreachable;
    d.origin = rank;
    d.reason = why.first;
    d.first_seen_ns = why.second;
    d.wall_ns = wall_from_monotonic(why.second);
    return d;  // origin is the dead rank, never this leader
  }

  std::vector<uint64_t> aborts_;
  std::map<std::string, std::pair<std::string, int64_t>> down_ranks_;  // rank -> (reason, seen ns)
};

// A kFail decision for a failure the leader observed itself (origin = the leader).
Decision local_failure(uint64_t room, ErrorCode code, std::string reason, const RankId& self);

}  // namespace kvferry
