// The replay router (`kvferry router`, spawned by `kvferry replay`): assigns rooms and faults,
// sends every request to both engines' leaders at its scaled arrival time with back-pressure,
// collects one RoomResult per engine per room, shuts the engines down and writes the results
// file (results.h). Messages: router_protocol.h over ControlSocket.
// Thread contract: run_router() runs on the calling thread until done.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvferry/error.h"
#include "kvferry/trace.h"
#include "replay/router_protocol.h"

namespace kvferry::replay {

struct RouterConfig {
  std::string trace_path;
  uint64_t max_requests = 0;   // 0: all
  double time_scale = 0;       // request i goes out at arrival_ms * time_scale after start
  double fault_rate = 0;       // probability per request
  uint64_t seed = 1;
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  std::string endpoint;        // bind (PULL), e.g. tcp://127.0.0.1:5600
  std::string prefill_leader;  // engine endpoints of the leaders
  std::string decode_leader;
  uint32_t max_inflight = 16;  // unfinished requests at most
  std::string results_path;
  double ready_timeout_s = 180;
  double request_timeout_s = 300;  // from dispatch to both results
  double stats_timeout_s = 30;     // after shutdown, for both stats frames
};

// Deterministic request plan: unique non-zero 63-bit rooms and faults from `seed`.
// Faults: each request independently with probability `fault_rate`; kinds alternate
// ("transfer" at a random prefill rank, then "decode_fail" at a random decode rank, ...).
// Requests keep the trace's order, stably sorted by arrival_ms.
std::vector<RouterRequest> plan_requests(const std::vector<TraceRequest>& trace, uint64_t seed,
                                         double fault_rate, uint32_t prefill_tp,
                                         uint32_t decode_tp);

// Runs the router. Returns 0 when every request finished (successfully or not) and the results
// file was written; non-zero with a message on stderr otherwise (engines never ready, cannot
// bind, cannot write the results).
int run_router(const RouterConfig& config);

}  // namespace kvferry::replay
