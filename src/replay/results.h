// What the router hands to the orchestrator: every request's outcome from both engines, the
// engines' leak statistics and the dispatch timeline. Written by `kvferry router --results FILE`
// as JSON, read back by `kvferry replay` to build the report.
//
// File shape (JSON object):
//   {"version":1, "dispatch_start_ns":N, "dispatch_end_ns":N, "last_result_ns":N,
//    "requests":[{"room":"<u64>","input_tokens":N,"output_tokens":N,"arrival_ms":N,
//                 "dispatched_ns":N, "fault":null|{"kind":..,"at":..},
//                 "prefill":null|<RoomResult as in driver/engine_protocol.h>, "decode":null|<RoomResult>,
//                 "router_failure":"" | "router: no result within 300 s",
//                 "abort_sent_ns":N (0: no abort sent), "error":"" | final_error()
//                 [,"prefill_instance":I][,"decode_instance":J]  (xPyD: the instances the router
//                 chose; absent: 0)}...],
//    "stats":{"prefill":null|[RankLeakStats...], "decode":null|[RankLeakStats...]}
//    [,"scale":[ScaleRecord as JSON, field names as below...]]}  (--scale only)
// Times are CLOCK_MONOTONIC ns (kvferry::monotonic_ns), comparable with the engines' times.
// Thread contract: pure functions. Errors: kProtocolError for a malformed file.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "driver/engine_protocol.h"
#include "kvferry/error.h"

namespace kvferry::replay {

struct RequestOutcome {
  uint64_t room = 0;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  uint64_t arrival_ms = 0;
  int64_t dispatched_ns = 0;  // 0: never dispatched
  std::optional<FaultSpec> fault;
  std::optional<RoomResult> prefill;
  std::optional<RoomResult> decode;
  std::string router_failure;  // set when the router gave up on the request
  int64_t abort_sent_ns = 0;   // when the router sent the room's abort (0: none sent)
  uint32_t prefill_instance = 0;  // xPyD: the instances the router sent the request to
  uint32_t decode_instance = 0;
  std::string error;           // final_error() when the request finished
};

// The request's final error as the router reports it ("" when both engines report Success):
//   "room R failed: <code> at <origin>: <reason>"
// from the decode engine's result when it failed (the request ends there), else the prefill
// engine's; " (prefill engine: <code> at <origin>)" is appended when the engines disagree.
// A request the router gave up on: "room R failed: internal at router: <router_failure>".
std::string final_error(const RequestOutcome& q);

// One planned join or leave (--scale, scale_plan.h) as the router carried it out. Times: monotonic
// ns, 0 when it did not happen.
struct ScaleRecord {
  double t_s = 0;
  bool join = false;
  Role role = Role::kPrefill;
  uint32_t instance = 0;
  int64_t event_ns = 0;          // the event's time (the router's dispatch start + t_s)
  int64_t ready_ns = 0;          // join: every DP group leader of the instance sent "ready"
  int64_t first_room_ns = 0;     // join: the first request dispatched to it
  uint64_t in_flight_at_event = 0;  // leave: its outstanding requests at the event
  int64_t leave_sent_ns = 0;     // leave: the last of them finished; "leave" sent to its leaders
  int64_t left_ns = 0;           // leave: every DP group's final stats arrived (its ranks exit)
  uint64_t rooms = 0;            // requests dispatched to the instance after the event
  uint64_t failed_rooms_caused = 0;  // of those and (leave) the ones in flight at the event: failed
};

struct ReplayResults {
  int64_t dispatch_start_ns = 0;  // router's time zero (both engines ready)
  int64_t dispatch_end_ns = 0;    // last request sent
  int64_t last_result_ns = 0;     // last RoomResult received
  std::vector<RequestOutcome> requests;
  std::optional<std::vector<RankLeakStats>> prefill_stats;
  std::optional<std::vector<RankLeakStats>> decode_stats;
  std::vector<ScaleRecord> scale;  // --scale: one per event, by time
};

std::string encode_results(const ReplayResults& r);
Result<ReplayResults> decode_results(const std::string& text);

}  // namespace kvferry::replay
