// JSON frames of the engine's per-step agreement (leader tp0 <-> followers), internal to an engine:
//   {"type":"hello","tp_rank":R,"endpoint":"tcp://..."}                       follower -> leader
//   {"type":"step","seq":K,"shutdown":false,"decisions":[Decision...],
//    "members":[{"tp":R,"endpoint":"tcp://..."}...]}                          leader -> followers
//       ("members": the engine's followers, only in a step after the list changed)
//   {"type":"fail","tp_rank":R,"room":"<u64>", Failure fields}               any rank -> its siblings
// Failure fields (a kFail decision, a failed room's kRelease, a report with a failure, the fan-out):
// the failure record's one JSON codec, core/failure_json.h ("code" is the code's name).
//   {"type":"hi","tp_rank":R}   follower -> follower: opens the connection the fan-out will use
//   {"type":"reply","seq":K,"tp_rank":R,"rooms":[RoomReport...],"stats":{}}  follower -> leader
//       (decode: a quarantined room reclaimed on the rank is the short report
//        {"room":"<u64>","tp":R,"reclaimed":true}; its kReclaim decision is {"op":5,"room":"<u64>"})
//   {"type":"abort","room":"<u64>"}                                         router -> leader
//   {"type":"down","reason":"..."}   leader -> a follower it declared down that still answers (it
//       had stalled): it fails and releases its rooms, then says hello again (engine_loop.h)
// Room ids are decimal strings. Parsing never throws: malformed frames give kProtocolError.
#pragma once
#include <string>
#include <vector>

#include "driver/engine_protocol.h"

namespace kvferry {

struct SyncFrame {
  std::string type;  // hello, step, reply, or a router frame type (request, shutdown, ...)
  uint32_t tp_rank = 0;
  std::string endpoint;
  std::string reason;  // down
  uint64_t seq = 0;
  uint64_t room = 0;  // abort
  bool shutdown = false;
  bool leave = false;  // step with shutdown: the router's "leave" (every rank leaves in order first)
  std::vector<Decision> decisions;
  bool has_members = false;             // step: the member list changed
  std::vector<EngineMember> members;    // step, when has_members
  SiblingFailure fail;                  // fail
  std::vector<RoomReport> rooms;
  RankLeakStats stats;
  std::string raw;  // the frame text (router frames are decoded by engine_protocol.h)
};

std::string encode_hello(uint32_t tp_rank, const std::string& endpoint);
// `members`: null when the list did not change since the last step.
// `leave` (with `shutdown`): the step says "leave", sent as "leave":true (absent: false).
std::string encode_step(uint64_t seq, bool shutdown, const std::vector<Decision>& decisions,
                        const std::vector<EngineMember>* members = nullptr, bool leave = false);
// The fan-out frame. Decoding rejects (kProtocolError) an unknown code, an origin that is not a
// RankId, a negative first_seen_ns, a missing field or a field of the wrong type.
std::string encode_fail(const SiblingFailure& f);
std::string encode_hi(uint32_t tp_rank);
std::string encode_down(const std::string& reason);
std::string encode_reply(uint64_t seq, uint32_t tp_rank, const std::vector<RoomReport>& rooms,
                         const RankLeakStats& stats);
Result<SyncFrame> decode_sync_frame(const std::string& text);
// JSON objects of one Decision / one RoomReport as the step frames carry them.
std::string encode_decision_json(const Decision& d);
std::string encode_report_json(const RoomReport& r);

}  // namespace kvferry
