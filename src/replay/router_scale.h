// The router's side of --scale (scale_plan.h, router.h): instances that join and leave while the
// trace is served.
//   - join: the instance is not chosen (EngineInstances::live) until every DP group leader of it
//     sent "ready" (the orchestrator starts it at its event time); the router then opens its
//     connections to them and chooses it from then on.
//   - leave: from the event on (for an instance that joins: from its join on) the instance is not chosen; once it has no outstanding request the
//     router sends {"type":"leave"} to its leaders (every rank then leaves in order: Manager::leave(),
//     drained(), exit 0); it has left when every DP group's final stats frame arrived. It gets no
//     shutdown later.
// The router's dispatch loop runs until every event happened (settled()), even after the last
// request finished. Records (ScaleRecord, results.h): per event its times, the requests in flight
// at it, the requests dispatched to the instance after it and how many of those (and, for a leave,
// of the ones in flight at it) failed.
// Thread contract: the router's thread only.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kvferry/error.h"
#include "replay/results.h"
#include "replay/router_instances.h"
#include "replay/scale_plan.h"

namespace kvferry::replay {

class RouterScale {
 public:
  // Marks every instance that joins later as not live in `inst` (sized for every instance).
  RouterScale(std::vector<ScaleEvent> events, EngineInstances& inst);

  bool active() const { return !ev_.empty(); }
  // The router's time zero: every event's time counts from it.
  void start(int64_t dispatch_start_ns);
  // Due leave events stop their instance's choice (noting `inflight` requests routed to it); a
  // draining instance with no outstanding request gets the leave frame through `send_leave`
  // (each of its leaders). kWaitingTimeout when a join was not ready within `ready_timeout_s` of
  // its event or a leave did not end within `leave_timeout_s`.
  Status advance(int64_t now, const std::vector<size_t>& inflight, const std::vector<RequestOutcome>& requests,
                 const std::function<Status(const std::string& leader)>& send_leave, double ready_timeout_s,
                 double leave_timeout_s);
  // A "ready" frame from a leader: true when it completed a joining instance (the caller opens
  // the connections to its leaders and then calls joined()).
  bool on_ready(Role role, uint32_t instance, uint32_t dp_rank);
  void joined(Role role, uint32_t instance, int64_t now);
  // A DP group's stats frame (its leader exits after it).
  void on_stats(Role role, uint32_t instance, uint32_t dp_rank, int64_t now);
  // Request `index` went to these instances.
  void on_dispatch(size_t index, uint32_t prefill, uint32_t decode, int64_t now);
  // Every event happened: every join is live, every leave left.
  bool settled() const;
  // Whether the instance left (the router sends it nothing more).
  bool left(Role role, uint32_t instance) const;
  // The records, failed_rooms_caused counted from `requests` (their error; a request with a
  // planned fault failed for its fault and is not counted).
  std::vector<ScaleRecord> records(const std::vector<RequestOutcome>& requests) const;

 private:
  enum class State { kPending, kWaiting, kDraining, kLeaving, kDone };
  struct Event {
    ScaleEvent plan;
    ScaleRecord rec;
    State state = State::kPending;
    std::set<uint32_t> groups;   // join: DP groups ready; leave: DP groups whose stats arrived
    std::vector<size_t> touched; // requests in flight at the event (leave) or dispatched after it
  };
  Event* find(Role role, uint32_t instance, bool join);
  const Event* find(Role role, uint32_t instance, bool join) const;

  std::vector<Event> ev_;
  EngineInstances& inst_;
  int64_t start_ns_ = 0;
};

}  // namespace kvferry::replay
