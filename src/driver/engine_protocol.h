// The engine protocol: what the router (or any client that schedules rooms) and an engine's
// leader rank (tp0 of each engine) say to each other, and the value types of the engine's
// per-step agreement between its ranks (the step frames' codec: sync_codec.h). JSON text frames
// over ControlSocket (ZeroMQ). Internal to kvferry: these are not the prefill<->decode control
// plane (see messages.h). The driver layer owns it; replay's router is one client.
//
// Router -> leader (to the leader's engine endpoint):
//   RouterRequest   {"type":"request","room":"<u64 decimal>","input_tokens":N,"output_tokens":N,
//                    "arrival_ms":N,"fault":null | {"kind":"transfer"|"decode_fail"|
//                    "prefill_fail"|"timeout","at":"prefill/tp1"}}  (FaultSpec, never "abort")
//                   [,"bootstrap":"host:port"]  (decode, xPyD: the bootstrap service of the prefill
//                   instance the router chose for the room; absent: the rank's default one)
//   {"type":"shutdown"}                      leader tells followers, every rank exits cleanly
//   {"type":"leave"}                         as shutdown, and every rank leaves in order first
//                                            (Manager::leave(), drained()): the instance is removed
//                                            while the others serve on (the replay's --scale)
//   {"type":"abort","room":"<u64>"}         (decode leader only) fail the room, code aborted
//                                            (encoded here, decoded by the engine's sync codec)
// Leader -> router (to the router endpoint):
//   EngineReady     {"type":"ready","role":"prefill","tp_size":N[,"dp_rank":D][,"endpoint":"tcp://.."]
//                    [,"instance":I]}  (instance: the engine's instance in an xPyD replay, absent: 0)
//                   sent by the leader of each DP group (dp_rank absent: 0); endpoint: the
//                   leader's engine endpoint, where the router sends that group's requests
//   RankUp          {"type":"rank_up","rank":"decode/tp1[/dpD]"}   sent by a DP group's leader when
//                   a follower it had declared down says hello again (a restarted rank rejoined):
//                   the group serves rooms again
//   RoomResult      see struct below, "type":"result"
//   EngineStats     {"type":"stats","role":..[,"dp_rank":D][,"instance":I],"ranks":[{rank, live_rooms, records,
//                   pages_in_use, peers, quarantined_pages, reclaimed_pages}...]}   one per DP
//                   group, from its leader (the last two: optional, 0 when absent)
// (The replay's own router <-> orchestrator frames are replay/peer_death_frames.h.)
// Thread contract: pure functions and value types.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvferry/error.h"
#include "kvferry/poll.h"
#include "kvferry/transport.h"

namespace kvferry {

// A fault a request carries to the engines, injected by the replay's fault plan
// (replay/fault_plan.h decides which request gets which). Decoded once, from the request frame; a
// driver asks RoomFaults (driver/room_faults.h) what it means for its rank.
enum class FaultKind : uint8_t {
  kTransfer,     // "transfer": prefill: the transport fails the room's writes; decode: the rank
                 // declares the arrived data failed                          -> transfer_error
  kDecodeFail,   // "decode_fail": the decode rank fails the room on admission -> injected
  kPrefillFail,  // "prefill_fail": the prefill rank fails the room when it arrives -> injected
  kTimeout,      // "timeout": the rank's peers stay silent for the room, so its deadline expires
  kAbort,        // "abort": router only, never sent: the router aborts the room at the decode
                 // leader                                                     -> aborted
  kCorrupt,      // "corrupt": at a decode rank: each prefill source of it flips one byte of its
                 // first write to it in flight (the transport reports success); the decode
                 // rank's integrity check fails the room (needs --integrity)  -> integrity_error
};
std::string_view fault_kind_name(FaultKind kind);
std::optional<FaultKind> fault_kind_from_name(std::string_view name);

struct FaultSpec {
  FaultKind kind = FaultKind::kTransfer;
  RankId at;  // the rank the fault acts at, e.g. prefill/tp1
  std::string str() const;  // "transfer@prefill/tp1"
  friend bool operator==(const FaultSpec&, const FaultSpec&) = default;
};
// From a kind name and a rank string; nullopt if either is not valid.
std::optional<FaultSpec> fault_from_names(std::string_view kind, std::string_view at);

struct RouterRequest {
  uint64_t room = 0;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  uint64_t arrival_ms = 0;
  std::optional<FaultSpec> fault;
  // Decode: the chosen prefill instance's bootstrap service ("host:port", at most 255 bytes);
  // empty: the rank's default one (Manager::receiver()).
  std::string prefill_bootstrap;
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
  int64_t compute_end_ns = 0;     // prefill with the compute model: its last layer's compute
                                  // ended on the last rank (0: no compute model)
  int64_t success_ns = 0;         // decode: when the last rank saw Success (before verify)
  int64_t failed_all_ns = 0;      // when the last rank of this engine reached Failed
  int64_t first_failed_ns = 0;    // failure's first_seen_ns
  int64_t first_failed_wall_ns = 0;  // failure's wall_ns (0: not known)
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
  // Incarnations (kvferry/messages.h), for the rank's metrics only (not in the engine frames):
  // messages refused as stale by kind (registration, metadata, status, heartbeat), peer restarts.
  std::array<uint64_t, 4> stale_messages{};
  uint64_t peer_restarts = 0;
  // Frames refused from peers by kind (endpoint/refusals.h names, plus "foreign"), for the metrics.
  std::vector<std::pair<std::string, uint64_t>> refusals;
  uint64_t quarantined_pages = 0;  // decode: pages and aux rows quarantined now (leaked, not in pages_in_use)
  uint64_t reclaimed_pages = 0;    // decode: pages and aux rows given back after a quarantine, so far
  TransportStats transport;        // resident memory figures (kvferry/transport.h), for the metrics
  // The control plane's cost so far (ManagerStats control_*, heartbeats_sent), for the metrics:
  // frames sent, bytes sent, frames received, bytes received, heartbeats sent.
  std::array<uint64_t, 5> control{};
};

// The per-step agreement between the ranks of one engine (docs/design.md §3 "Propagation,
// within an engine"): each rank reports its rooms, the leader reduces them and decides, every rank applies
// the decisions in the same order (driver/engine.h; frames: driver/sync_codec.h).
// One rank's view of one room in one step.
struct RoomReport {
  uint64_t room = 0;
  uint32_t tp_rank = 0;
  KVPoll poll = KVPoll::Bootstrapping;
  bool drained = false;     // no peer write can still reach (decode) / come from (prefill) this room
  bool quarantine = false;  // decode: drained only because the drain deadline passed
  bool has_failure = false;
  ErrorCode code = ErrorCode::kOk;
  std::string origin;       // RankId::str()
  std::string reason;
  int64_t first_seen_ns = 0;
  int64_t wall_ns = 0;      // the failure's wall clock (Failure::wall_ns)
  int64_t failed_ns = 0;    // when this rank reached Failed
  int64_t send_ns = 0;      // prefill: first send()
  int64_t compute_end_ns = 0;  // prefill: the room's last layer's compute ended (compute model; 0: not yet, or none)
  int64_t success_ns = 0;   // decode: every source reported Success
  uint64_t bytes = 0;       // prefill: bytes written
  uint64_t verified = 0;    // decode: bytes verified
  uint64_t mismatched = 0;  // decode
  // decode: not a live room but a quarantined one (released with quarantine) whose quarantine
  // ended on this rank: every source confirmed the drain or died (decode_quarantine.cc). Only
  // `room` and `tp_rank` are meaningful; the leader decides kReclaim once every rank reports it.
  bool reclaimed = false;
};

struct Decision {
  // kReclaim (decode): the room's quarantined pages and aux row return to the pool on every rank.
  enum class Op { kNew, kStart, kAdmit, kFail, kRelease, kReclaim };
  Op op = Op::kNew;
  uint64_t room = 0;
  RouterRequest request;     // kNew
  // kFail: the failure to apply; kRelease of a failed room: the engine's root cause (the rule's
  // winner over every rank's report, docs/failure-model.md), which every rank logs by.
  ErrorCode code = ErrorCode::kOk;
  std::string origin;
  std::string reason;
  int64_t first_seen_ns = 0;
  int64_t wall_ns = 0;
  bool quarantine = false;   // kRelease
  // kFail made by the leader from its own observation (abort, rejection, prealloc timeout, a dead
  // engine rank): on the leader that failure is local. Never sent: followers get origin != self.
  bool observed_by_leader = false;
};

// A failure one rank of an engine tells every other rank of its engine directly (the fan-out,
// docs/design.md §3 "Propagation, within an engine"), ahead of the per-step agreement, which stays the
// authority for release and the router's result. Sent once per room by the rank that first
// recorded the failure first-hand or from the other engine; a receiver never sends it on.
struct SiblingFailure {
  uint64_t room = 0;
  uint32_t tp_rank = 0;      // the sending rank (logged as "via")
  ErrorCode code = ErrorCode::kOk;
  std::string origin;        // RankId::str() of the failure's origin (unchanged by the fan-out)
  std::string reason;
  int64_t first_seen_ns = 0; // monotonic ns, when the origin first saw the failure
  int64_t wall_ns = 0;       // Failure::wall_ns
};

// The failure record a report, decision or fan-out carries (an origin that is not a RankId gives
// the default RankId; the codecs reject such frames before they get here).
Failure failure_of(const RoomReport& r);
Failure failure_of(const Decision& d);
Failure failure_of(const SiblingFailure& f);
// Copies a failure record into a decision's failure fields.
void set_failure(Decision& d, const Failure& f);

// One rank of an engine as the leader announces it in a step: where its engine socket listens.
struct EngineMember {
  uint32_t tp_rank = 0;
  std::string endpoint;  // "tcp://host:port"
};

std::string encode_request(const RouterRequest& r);
std::string encode_shutdown();
std::string encode_leave();
std::string encode_ready(Role role, uint32_t tp_size, uint32_t dp_rank = 0,
                         const std::string& endpoint = "", uint32_t instance = 0);
std::string encode_result(const RoomResult& r);
std::string encode_stats(Role role, const std::vector<RankLeakStats>& ranks, uint32_t dp_rank = 0,
                         uint32_t instance = 0);
std::string encode_abort(uint64_t room);
std::string encode_rank_up(const RankId& rank);

// A decoded router-protocol frame. Exactly one of the optionals is set for known types.
struct RouterFrame {
  std::string type;  // "request", "shutdown", "leave", "ready", "result", "stats", "abort", "rank_up"
  std::optional<RouterRequest> request;
  std::optional<RoomResult> result;
  std::optional<Role> ready_role;
  uint32_t ready_tp_size = 0;
  std::string ready_endpoint;  // ready: the leader's engine endpoint ("" when not given)
  uint32_t dp_rank = 0;        // ready, stats: the DP group of the engine that sent it
  uint32_t instance = 0;       // ready, stats: the engine's instance (xPyD; 0 when absent)
  std::optional<std::vector<RankLeakStats>> stats;
  Role stats_role = Role::kPrefill;
  uint64_t abort_room = 0;   // abort
  std::optional<RankId> up_rank;  // rank_up
};
// kProtocolError for malformed JSON, a missing field or an unknown type.
Result<RouterFrame> decode_router_frame(const std::string& text);

}  // namespace kvferry
