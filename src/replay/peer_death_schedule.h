// The router's side of planned peer deaths (router.h, fault plan kind peer_death): the kills in
// plan order, one at a time, each through kPlanned -> kRequested (the router asked the
// orchestrator) -> kKilled -> kRestarted -> kDone (the rank proven back, or presumed so
// kRejoinSettleNs after its restart). It says when a kill is due (enough requests dispatched and
// a room in flight at the rank's engine, so that the kill has rooms to fail), whether dispatching
// is paused (the killed rank is not back in its engine yet: a leader's "ready", a follower's
// "rank_up" from its leader, driver/engine_protocol.h) and whether every death has settled; it
// follows the orchestrator's frames (peer_death_frames.h). The Router owns the requests and the
// sockets.
// Thread contract: one thread (the router's).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvferry/error.h"
#include "replay/fault_plan.h"
#include "replay/peer_death_frames.h"

namespace kvferry::replay {

// One planned kill as the router follows it.
struct Death {
  PlannedPeerDeath plan;
  RankId rank;
  enum class State { kPlanned, kRequested, kKilled, kRestarted, kDone } state = State::kPlanned;
  bool leader() const { return rank.tp_rank == 0; }
  int64_t killed_ns = 0;
  int64_t restarted_ns = 0;
  bool back = false;  // a follower: its engine's leader took it back after the kill (rank_up)
  size_t proven_after = 0;  // a request with index >= this that succeeds proves the rank is back
};

class PeerDeathSchedule {
 public:
  // `deaths`: plan_peer_deaths() (fault_plan.h), every rank a valid RankId.
  explicit PeerDeathSchedule(std::vector<PlannedPeerDeath> deaths);

  // The death in progress or next (the first not kDone); null when every one is done.
  Death* current();
  // The next planned kill is due: `dispatched` requests reached its threshold and `busy` (a room
  // is in flight at the engine, and DP group, of the rank: one without that engine's result yet).
  bool kill_due(size_t dispatched, bool busy);
  // A killed rank is not back in its engine yet: nothing new goes out (rooms dispatched now would
  // fail for want of it).
  bool paused();
  // All planned kills happened and the last restarted rank is back (router.h); `finished` of
  // `total` requests are done (a kill still planned when all are is skipped).
  bool settled(size_t finished, size_t total);
  // Asks for a due kill (kill_due(dispatched, busy)) through `ask` (the frame for the
  // orchestrator); errors: `ask`'s, or kWaitingTimeout when a death is not over within
  // `timeout_s` of its request.
  Status advance(int64_t now, size_t dispatched, bool busy, size_t total, size_t inflight,
                 double timeout_s, const std::function<Status(const std::string& frame)>& ask);
  // The leader of `rank`'s engine took it back (a "rank_up" frame): the killed follower is back.
  void on_rank_up(const RankId& rank);
  // A frame from the orchestrator; `dispatched`: requests sent so far.
  void on_frame(const PeerDeathFrame& f, size_t dispatched);
  // A request with index `i` finished without error.
  void on_success(size_t i);

 private:
  std::vector<Death> deaths_;
  int64_t since_ns_ = 0;  // when the current death's kill was requested
};

}  // namespace kvferry::replay
