// Messages between the replay router and the engines' leader ranks (tp0 of each engine), and
// between an engine's leader and its followers. JSON text frames over ControlSocket (ZeroMQ).
// Internal to kvferry: these are not the prefill<->decode control plane (see messages.h).
//
// Router -> leader (to the leader's engine endpoint):
//   RouterRequest   {"type":"request","room":"<u64 decimal>","input_tokens":N,"output_tokens":N,
//                    "arrival_ms":N,"fault":null | {"kind":"transfer"|"decode_fail"|"timeout",
//                    "at":"prefill/tp1"}}
//   {"type":"shutdown"}                      leader tells followers, every rank exits cleanly
//   {"type":"abort","room":"<u64>"}         (decode leader only) fail the room, code aborted
//                                            (encoded here, decoded by the engine's sync codec)
// Leader -> router (to the router endpoint):
//   EngineReady     {"type":"ready","role":"prefill","tp_size":N[,"dp_rank":D][,"endpoint":"tcp://.."]}
//                   sent by the leader of each DP group (dp_rank absent: 0); endpoint: the
//                   leader's engine endpoint, where the router sends that group's requests
//   RoomResult      see struct below, "type":"result"
//   EngineStats     {"type":"stats","role":..[,"dp_rank":D],"ranks":[{rank, live_rooms, records,
//                   pages_in_use, peers}...]}   one per DP group, from its leader
// Router <-> orchestrator (replay peer deaths; to the orchestrator's / router's endpoint):
//   {"type":"kill","rank":"prefill/tp1"}                         router asks for the planned kill
//   {"type":"killed","rank":..,"time_ns":N}                      SIGKILL sent at N (CLOCK_MONOTONIC)
//   {"type":"restarted","rank":..,"time_ns":N}                   same command line started again
//   {"type":"kill_failed","rank":..,"reason":".."}               the kill or the restart failed
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvferry/error.h"
#include "kvferry/poll.h"

namespace kvferry {

struct FaultSpec {
  std::string kind;  // sent to the engines: "transfer" (the rank fails the room's transfer),
                     // "decode_fail" (the decode rank fails the room, code injected),
                     // "prefill_fail" (the prefill rank fails the room, code injected), "timeout"
                     // (the rank's peer stays silent, so the rank's deadline expires);
                     // router only, never sent: "abort" (replay/fault_plan.h)
  std::string at;    // rank string, e.g. "prefill/tp1", "decode/tp0"
};

struct RouterRequest {
  uint64_t room = 0;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  uint64_t arrival_ms = 0;
  std::optional<FaultSpec> fault;
};

// One engine's verdict on one room, sent by its leader when every rank released the room.
struct RoomResult {
  Role role = Role::kPrefill;  // which engine reports
  uint64_t room = 0;
  KVPoll state = KVPoll::Failed;  // Success or Failed
  bool rejected = false;          // decode: can never fit the pools (code resource_exhausted)
  ErrorCode code = ErrorCode::kOk;
  std::string origin;             // rank string of the failure's origin ("" on success)
  std::string reason;
  int64_t first_send_ns = 0;      // prefill: first send() of the room on any rank
  int64_t success_ns = 0;         // decode: when the last rank saw Success (before verify)
  int64_t failed_all_ns = 0;      // when the last rank of this engine reached Failed
  int64_t first_failed_ns = 0;    // failure's first_seen_ns
  uint64_t bytes_transferred = 0; // prefill: bytes written, summed over ranks
  uint64_t bytes_verified = 0;    // decode: bytes checked, summed over ranks
  uint64_t bytes_mismatched = 0;  // decode
  uint32_t ranks_failed = 0;      // ranks of this engine that reached Failed
  uint32_t ranks_lost = 0;        // ranks of this engine down (dead) when it released the room:
                                  // their state of the room died with them
};

struct RankLeakStats {
  std::string rank;
  uint64_t live_rooms = 0;
  uint64_t records = 0;
  uint64_t pages_in_use = 0;
  uint64_t peers = 0;
};

std::string encode_request(const RouterRequest& r);
std::string encode_shutdown();
std::string encode_ready(Role role, uint32_t tp_size, uint32_t dp_rank = 0,
                         const std::string& endpoint = "");
std::string encode_result(const RoomResult& r);
std::string encode_stats(Role role, const std::vector<RankLeakStats>& ranks, uint32_t dp_rank = 0);
std::string encode_abort(uint64_t room);
// Router <-> orchestrator frames; `type` is kill, killed, restarted or kill_failed.
std::string encode_peer_death(const std::string& type, const std::string& rank, int64_t time_ns,
                              const std::string& reason);

// A decoded router-protocol frame. Exactly one of the optionals is set for known types.
struct RouterFrame {
  std::string type;  // "request", "shutdown", "ready", "result", "stats", "abort", "kill",
                     // "killed", "restarted", "kill_failed"
  std::optional<RouterRequest> request;
  std::optional<RoomResult> result;
  std::optional<Role> ready_role;
  uint32_t ready_tp_size = 0;
  std::string ready_endpoint;  // ready: the leader's engine endpoint ("" when not given)
  uint32_t dp_rank = 0;        // ready, stats: the DP group of the engine that sent it
  std::optional<std::vector<RankLeakStats>> stats;
  Role stats_role = Role::kPrefill;
  uint64_t abort_room = 0;   // abort
  std::string rank;          // kill, killed, restarted, kill_failed
  int64_t time_ns = 0;       // killed, restarted
  std::string reason;        // kill_failed
};
// kProtocolError for malformed JSON, a missing field or an unknown type.
Result<RouterFrame> decode_router_frame(const std::string& text);

}  // namespace kvferry
