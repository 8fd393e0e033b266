// The replay report: classification of every request, byte counts, throughput, latency
// percentiles, fault attribution and an independent count of log lines per room.
// docs/report.md documents every field of report.json.
//
// Classification of one request (from both engines' RoomResults):
//   rejected   decode result has rejected == true (can never fit the pools; not a failure)
//   succeeded  both engines report Success
//   failed     everything else (including a request the router gave up on)
// Faults: an injected fault that failed its room is listed in `faults` with the observed origin
// (the decode result's origin; when the engines name different origins both are listed, which
// never equals the injected rank, so it counts as misattributed) and is attributed correctly when
// that origin is the injected rank and the code is the kind's (expected_code()). A fault whose
// room succeeded, was rejected, or was failed first by a peer death (the faulty rank never got
// to act) goes to `faults_not_applied`.
// Peer deaths: a failed room whose every failed result names the killed rank as origin with code
// peer_unreachable is that death's (rooms_failed), not an unexpected failure. Other failures
// without an applied fault whose first failure falls between the kill and 10 s after the restart
// count as the death's rooms_misattributed (and stay unexpected failures).
// Building the report (classification, attribution, problems): report.cc; report.json and the
// summary text: report_json.cc; the log scan: log_scan.h.
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "replay/log_scan.h"
#include "replay/results.h"

namespace kvferry::replay {

// xPyD ("Instances", docs/report.md): a rank is named by its instance, "prefill1/tp0",
// "decode1/tp0" (instance 0: no number), as its log file. A decode rank's engine id is its
// instance, so the origins it reports already say so; every prefill instance's ranks are engine 0
// in the library, so a prefill origin is named with the prefill instance of the room (the one the
// router sent it to: a room touches one instance of each role). The same for a fault's rank.
std::string instance_origin(const std::string& origin, const RequestOutcome& q);

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
  uint64_t count = 0;
};
// Nearest-rank percentiles (the smallest value with at least p% of values <= it). Empty: zeros.
Percentiles percentiles(std::vector<double> values);

struct FaultEntry {
  std::string room;  // decimal
  std::string kind;
  std::string injected_at;
  std::string observed_origin;
  std::string code;
  std::string reason;
  std::string expected_code;  // of the kind (fault_plan.h expected_code())
  std::string error;          // the router's final error (results.h final_error()), "" if none
  std::string outcome;  // "failed", "succeeded", "rejected", "failed_by_peer_death" (not applied)
  uint64_t lines_above_debug = 0;
  uint32_t ranks_failed = 0;
  double time_to_all_failed_ms = 0;
  // Ranks of an engine that had already concluded the room with Success (every write of the
  // prefill engine acknowledged) before the failure, observed later on the decode side, could
  // reach them: they stay at Success, as SGLang's prefill sender does (docs/report.md "Faults").
  uint32_t ranks_concluded = 0;
  uint32_t ranks_lost = 0;  // ranks down (killed) when their engine released the room
  uint32_t ranks_total = 0;  // prefill_tp + decode_tp (0 when the router gave up on the request)
  std::vector<std::string> concluded_engines;  // "prefill" / "decode" whose verdict is Success
  // Ranks neither Failed nor concluded (an engine's verdict missing): 0 in a clean replay.
  uint32_t ranks_unaccounted() const {
    const uint32_t known = ranks_failed + ranks_concluded + ranks_lost;
    return ranks_total > known ? ranks_total - known : 0;
  }
  bool attributed() const {
    return observed_origin == injected_at && (expected_code.empty() || code == expected_code);
  }
};

struct FailureEntry {
  std::string room;
  std::string origin;
  std::string code;
  std::string reason;
  std::string error;  // the router's final error
};

// A planned kill as the orchestrator carried it out.
struct PeerDeathRecord {
  std::string rank;          // "prefill/tp1"
  int64_t killed_ns = 0;     // CLOCK_MONOTONIC when SIGKILL was sent
  double killed_at_s = 0;    // since the replay started
  bool restarted = false;
  int64_t restarted_ns = 0;
  bool same_ports = false;  // restart@: back on the ports the killed process had bound
  // The other engine exchanges data with this rank (endpoint/topology.h), so it is expected to
  // detect the death too. False for a rank no peer writes to or reads from: an MLA prefill rank
  // that is no decode rank's source, a replica of a replicated KV head; then only its own engine
  // (the per-step agreement) can see it die.
  bool other_engine_peers = true;
};

struct PeerDeathEntry {
  PeerDeathRecord record;
  struct Detection {
    std::string engine;  // "prefill" / "decode"
    std::string rank;    // the rank that logged it
    double ms = 0;       // from the kill to its peer_dead line
  };
  std::vector<Detection> detections;       // per detecting engine, its first line above debug
  std::vector<std::string> expected_engines;  // the other engine, and its own if TP > 1
  uint64_t lines_above_debug = 0;  // peer_dead lines for this rank (kill to next kill)
  uint64_t rooms_failed = 0;       // rooms failed with origin == rank, code peer_unreachable
  uint64_t rooms_misattributed = 0;
  std::vector<std::string> misattributed_examples;  // final errors, first 3
  // Rooms failed by the death that logged a line above debug anywhere (their failure is
  // propagated on every live rank: they must log none), and the first such room.
  uint64_t rooms_with_lines = 0;
  std::string first_room_with_lines;
  // After the restart (report_net.cc): rooms dispatched once the restarted process was spawned;
  // how many of those dispatched after the first one that succeeded (the rank is back) failed
  // without a room fault; from the restart to that first success (-1: none). A restart@ (same
  // ports) must have one succeed and none fail after it (problems()).
  uint64_t rooms_after_restart = 0;
  uint64_t rooms_after_restart_failed = 0;
  double first_success_after_restart_ms = -1;
  // Messages refused for their incarnation (kvferry/messages.h) from the kill to the next kill
  // of the rank (or the end): "stale_refused" log lines, by any rank.
  uint64_t stale_refused = 0;
};

// A network fault (link_down / partition, fault_plan.h) as the orchestrator carried it out
// (net_fault_executor.h). Times are CLOCK_MONOTONIC ns.
struct NetFaultRecord {
  std::string kind;  // link_down | partition
  std::string host;
  int64_t ms = 0;                  // planned length
  int64_t start_ns = 0;            // injected (0: not injected)
  int64_t end_ns = 0;              // healed (0: not healed)
  std::vector<std::string> links;  // link_down: the links set down
  std::string error;               // why it could not be injected or healed ("" if it was)
};

// The checks of one network fault (report_netfault.cc, docs/report.md "Network faults"). The
// ranks on the fault's host are one side of the cut, every other rank the other. A room is
// affected when it involves the host (a rank of either engine there), was dispatched before the
// heal and had not concluded before the start.
struct NetFaultEntry {
  NetFaultRecord record;
  // Shorter than the heartbeat timeout: nothing may be lost (a room fails only if a write really
  // failed, peer_unreachable across the cut) and nobody may stay blacklisted.
  bool beyond_timeout = false;
  // The longest silence a live-looking peer is given before it is declared dead
  // (endpoint/peer_monitor.h): a cut network's, kUnreachableFactor x the heartbeat timeout; a
  // stopped process's (its socket still accepts), kHungFactor x. Longer than that: peers must be
  // declared dead and every affected room in flight at the start must fail. In between, either
  // may happen (a heal may come before the verdict).
  int64_t detection_bound_ms = 0;
  bool must_detect = false;
  uint64_t rooms_affected = 0;
  uint64_t rooms_failed = 0;        // affected, failed with peer_unreachable across the cut
  uint64_t rooms_misattributed = 0;  // affected, failed otherwise (first examples below)
  std::vector<std::string> misattributed_examples;
  uint64_t rooms_survived = 0;  // in flight at the start, succeeded after start + heartbeat timeout
  // Failed affected rooms: from the start (or the room's dispatch, if later) until every rank of
  // every engine of the room was Failed.
  Percentiles to_all_failed_ms;
  // peer_dead lines above debug from the start to the settle time, between the two sides, and
  // per (detecting engine, dead peer) pair; a pair with more than one line is a problem, and so
  // is a line between ranks of one side (a false death).
  uint64_t peer_dead_lines = 0;
  std::vector<std::string> repeated_detections;  // "prefill engine declared decode/tp1 dead 2 times"
  std::vector<std::string> same_side_lines;      // "prefill/tp0 declared prefill/tp1 dead"
  std::vector<std::string> undetected;  // must_detect: ranks of the host no engine off it declared dead
  // After the heal: rooms dispatched from the heal on; how many of those dispatched after the
  // first of them that succeeded failed without a room fault; the heal to the first room that
  // succeeded after it (any room, -1: none).
  uint64_t rooms_after = 0;
  uint64_t rooms_after_failed = 0;
  double first_success_after_ms = -1;
};

struct RejectedEntry {
  std::string room;
  uint64_t input_tokens = 0;
  std::string reason;
};

// The prefill compute model's transfer tail of one succeeded request (replay --prefill-ms-per-layer):
// from the end of its last layer's compute (last prefill rank) to decode's Success (last rank).
struct TailEntry {
  std::string room;
  uint64_t input_tokens = 0;
  double ms = 0;
};

// One engine instance's share of an xPyD replay (report_instances.cc).
struct InstanceFigures {
  Role role = Role::kPrefill;
  uint32_t instance = 0;
  uint64_t rooms = 0, succeeded = 0, failed = 0, rejected = 0;
  uint64_t bytes = 0;          // prefill: bytes written; decode: bytes verified
  uint64_t bytes_mismatched = 0;  // decode
  double gb_per_s = 0;         // bytes over the replay's transfer_seconds
  Percentiles transfer_latency_ms;  // succeeded rooms, first send to decode success
  uint64_t faults = 0;         // injected faults of rooms here that failed them (report `faults`)
  uint64_t faults_attributed = 0;
  // Rooms by the other role's instance (a decode instance: by prefill instance, and the reverse).
  std::vector<uint64_t> rooms_by_peer_instance;
  std::string name() const;    // "prefill instance 1"
};

// One planned join or leave (--scale) as the report gives it (report_scale.cc). Times in ms;
// -1 where it does not apply or did not happen.
struct ScaleEventFigures {
  ScaleRecord rec;           // the router's record (results.h)
  double ready_ms = -1;      // join: the orchestrator's start of the instance -> its ready
  double first_room_ms = -1; // join: the orchestrator's start -> its first request dispatched
  double drained_ms = -1;    // leave: the event -> every DP group's final stats (its ranks exit)
  uint64_t peer_dead_lines = 0;  // leave: peer_dead lines above debug naming its ranks after the event
  std::string name() const;  // "t=2s +prefill instance 1"
};

struct Report {
  uint64_t total = 0, succeeded = 0, failed = 0, rejected = 0;
  uint64_t bytes_transferred = 0, bytes_verified = 0, bytes_mismatched = 0;
  double transfer_seconds = 0;   // first dispatch to last result
  double throughput_gb_per_s = 0;  // bytes_transferred / transfer_seconds / 1e9
  Percentiles transfer_latency_ms;
  // With the compute model only (empty, count 0 without): every succeeded request's tail, in
  // request order, and their percentiles.
  std::vector<TailEntry> transfer_tails;
  Percentiles transfer_tail_ms;
  std::vector<RejectedEntry> rejected_requests;
  std::vector<FaultEntry> faults;
  std::vector<FaultEntry> faults_not_applied;
  std::vector<FailureEntry> unexpected_failures;
  std::vector<PeerDeathEntry> peer_deaths;
  std::vector<NetFaultEntry> net_faults;
  std::vector<std::string> unexplained_peer_dead;  // peer_dead lines above debug for no kill
  LogScan logs;
  std::vector<std::string> process_problems;  // from the orchestrator (e.g. a rank exited non-zero)
  std::vector<std::string> process_exits;     // "prefill/tp0 (pid 12) exited with code 0", ...
  std::vector<InstanceFigures> instances;     // xPyD only (add_instance_figures()); empty otherwise
  std::vector<ScaleEventFigures> scale_events;  // --scale only (add_scale_events())
  uint64_t faults_misattributed() const;
  uint64_t faults_not_one_line() const;  // faults whose lines_above_debug != 1
  // Problems that make `kvferry replay` exit 1 (empty: the replay is clean).
  std::vector<std::string> problems() const;
};

// The restart checks of every peer death (report_net.cc): rooms after the restart, stale
// messages refused; and their problems (appended to `p`).
void add_restart_checks(Report& rep, const ReplayResults& results, const LogScan& logs);
void restart_problems(const Report& rep, std::vector<std::string>& p);

// The network fault checks (report_netfault.cc): one NetFaultEntry per fault; the failures and
// peer_dead lines a fault explains are taken out of unexpected_failures and
// unexplained_peer_dead. `rank_host`: every rank's host key (RankId::str() -> key; empty without
// --hosts). A pause (its record's "host" is the rank) cuts off only its rank.
void add_net_fault_checks(Report& rep, const ReplayResults& results, const std::vector<NetFaultRecord>& faults,
                          const std::map<std::string, std::string>& rank_host, int64_t heartbeat_timeout_ms);
void net_fault_problems(const Report& rep, std::vector<std::string>& p);
// report.json's "net_faults" (a JSON array text) and the summary's lines about them.
std::string net_faults_json(const Report& rep);
std::string net_faults_text(const Report& rep);

// `deaths`: the orchestrator's planned kills; the TP sizes tell which engines detect a death.
Report build_report(const ReplayResults& results, const LogScan& logs,
                    const std::vector<PeerDeathRecord>& deaths = {}, uint32_t prefill_tp = 1,
                    uint32_t decode_tp = 1);

// report.json text: the report plus `config` (a JSON object text), `wall_s`, `leaks` from the
// engines' stats, and `status`/`error` ("ok" or "failed" with the orchestrator's message).
std::string report_json(const Report& report, const ReplayResults& results,
                        const std::string& config_json, double wall_s, const std::string& error);
// A report for a replay that stopped early: config, status "failed", error, and whatever
// results were available (may be none).
std::string partial_report_json(const std::string& config_json, double wall_s,
                                const std::string& error);

// xPyD: fills rep.instances from the results (every instance of each role, also one that got no
// room); call after build_report(). Nothing with one instance of each role.
void add_instance_figures(Report& rep, const ReplayResults& results, uint32_t prefill_instances,
                          uint32_t decode_instances);
// report.json's "instances" (an array, one object per instance, prefill first) and the summary's
// lines for them (report_json.cc adds both when rep.instances is not empty).
std::string instances_json(const Report& rep);
std::string instances_text(const Report& rep);

// --scale: fills rep.scale_events from results.scale; `started_ns`: when the orchestrator started
// each joining instance ((role, instance) -> monotonic ns). Problems (scale_problems()): a join
// never ready, a leave that did not end, a room of the leaving instance after its event, a failed
// room caused by an event, a peer_dead line above debug about a leaving instance's rank.
void add_scale_events(Report& rep, const ReplayResults& results,
                      const std::map<std::pair<Role, uint32_t>, int64_t>& started_ns);
void scale_problems(const Report& rep, std::vector<std::string>& p);
std::string scale_events_json(const Report& rep);  // report.json's "scale_events" (an array)
std::string scale_events_text(const Report& rep);  // the summary's lines

// A few human lines: requests, ok/failed/rejected, GB moved, GB/s, p50/p99, faults x/y, mismatches.
std::string summary_text(const Report& report, double wall_s);

}  // namespace kvferry::replay
