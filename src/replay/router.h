// The replay router (`kvferry router`, spawned by `kvferry replay`): assigns rooms and faults,
// sends every request to both engines' leaders at its scaled arrival time with back-pressure,
// to the DP group of each engine that serves the room (dp_rank_for_room(), kvferry/routing.h,
// the same rule the ranks use); waits for "ready" from every DP group's leader first;
// collects one RoomResult per engine per room, shuts the engines down and writes the results
// file (results.h). Messages over ControlSocket: driver/engine_protocol.h with the engines,
// peer_death_frames.h with the orchestrator.
// Faults (fault_plan.h): per-room faults go to both engines with the request, except abort: the
// router sends {"type":"abort"} to the decode leader abort_delay_ms() after the dispatch (unless
// the room finished first). Peer deaths: once `after_dispatched` requests went out and a room is
// in flight at the rank's engine (no result from it yet: the kill has a room to fail, however
// far the replay lags its trace), the router asks the orchestrator for the kill, dispatches
// nothing new until the rank is back in its engine (rooms dispatched while it is down would only
// fail for want of it, and under load the whole rest of the trace could go out in that window),
// and then
//   - a follower: is back when the orchestrator restarted it and its engine's leader sent
//     "rank_up" for it (the follower said hello again); the engines fail the rooms in flight
//     that needed the dead rank themselves;
//   - an engine leader: is back when that engine's restarted leader sends "ready" again; the new
//     leader knows none of the old rooms, so the router then finishes every in-flight request
//     still waiting for that engine with a synthesized Failed result (origin the leader, code
//     peer_unreachable, reason "engine leader restarted", ranks_failed 0).
// Peer deaths run one at a time; before shutting down, the router waits until the last killed
// rank was restarted and proven back (a later room succeeded) or 3 s passed since its restart.
// Progress: while requests finish, the results so far go to `<results>.progress` (same format) at
// most every 500 ms. SIGTERM/SIGINT: the router stops dispatching, writes the results so far to
// the results file and exits 128+N (core/stop_request.h); the engines are not shut down by it.
// xPyD (prefill_instances / decode_instances > 1, router_instances.h): each instance is its own
// engine (its DP groups, its leaders); per request the router picks the prefill and the decode
// instance with the fewest outstanding requests (ties: router_instances.h), sends the request to
// that instance's DP group leaders, the decode one naming the chosen prefill instance's bootstrap
// service; a decode fault's rank gets the decode instance as engine id (the decode ranks' own).
// It waits for "ready" from every leader of every instance. Peer deaths need one instance each.
// Thread contract: run_router() runs on the calling thread until done.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "driver/engine_protocol.h"
#include "kvferry/error.h"
#include "kvferry/trace.h"
#include "replay/fault_plan.h"

namespace kvferry::replay {

struct RouterConfig {
  std::string trace_path;
  uint64_t max_requests = 0;   // 0: all
  double time_scale = 0;       // request i goes out at arrival_ms * time_scale after start
  std::string faults;          // fault plan spec (fault_plan.h); empty: from fault_rate
  double fault_rate = 0;       // --fault-rate shorthand, used when `faults` is empty
  uint64_t seed = 1;
  std::string orchestrator;    // endpoint of the orchestrator (peer deaths); "" when none planned
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  uint32_t prefill_dp = 1;     // DP groups per engine: each its own leader and followers
  uint32_t decode_dp = 1;
  uint32_t prefill_instances = 1;  // xPyD: engine instances per role
  uint32_t decode_instances = 1;
  // host:port of each prefill instance's bootstrap service (with prefill_instances > 1: one each),
  // sent to the decode leader with each request.
  std::vector<std::string> prefill_bootstraps;
  // --scale (scale_plan.h, router_scale.h): instances that join and leave; prefill_instances and
  // decode_instances are the ones there from the start, prefill_bootstraps names every prefill
  // instance's bootstrap service, the joining ones' too.
  std::string scale;
  std::string endpoint;        // bind (PULL), e.g. tcp://10.0.0.1:5600; what engines send to
  std::string bind_host;       // listen here instead of endpoint's host (kvferry/net.h; "": that host)
  std::string advertise_host;  // the host to report instead of endpoint's host ("": that host)
  // Engine endpoints of the leaders, index = instance * DP + DP rank. Empty (or fewer than dp): learned from the
  // leaders' "ready" frames, which carry the endpoint; a "ready" endpoint always wins.
  std::vector<std::string> prefill_leaders;
  std::vector<std::string> decode_leaders;
  std::string port_file;       // when set: the bound port of `endpoint` is written here (decimal)
  uint32_t max_inflight = 16;  // unfinished requests at most
  std::string results_path;
  double ready_timeout_s = 180;
  double request_timeout_s = 300;  // from dispatch to both results
  double stats_timeout_s = 30;     // after shutdown, for both stats frames
};

// Deterministic request plan: unique non-zero 63-bit rooms from `seed` (independent of the fault
// plan) and per-room faults from assign_room_faults(). Requests keep the trace's order, stably
// sorted by arrival_ms. A fault's rank is placed in the DP group that serves its room
// ("prefill/tp1" becomes "prefill/tp1/dp1" for a room of prefill DP group 1).
std::vector<RouterRequest> plan_requests(const std::vector<TraceRequest>& trace, uint64_t seed,
                                         const FaultPlan& faults, uint32_t prefill_tp,
                                         uint32_t decode_tp, uint32_t prefill_dp = 1,
                                         uint32_t decode_dp = 1);

// Runs the router. Returns 0 when every request finished (successfully or not) and the results
// file was written; non-zero with a message on stderr otherwise (engines never ready, cannot
// bind, cannot write the results).
int run_router(const RouterConfig& config);

}  // namespace kvferry::replay
