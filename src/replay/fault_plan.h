// The replay's fault plan (`kvferry replay --faults`, docs/report.md "Faults").
//
// Spec: comma-separated items KIND[@PLACE]:RATE|once, e.g.
//   transfer@prefill:0.02,transfer@decode:0.01,abort:0.01,peer_death@prefill/tp1:once
// KIND   transfer     the rank's transport fails the room's writes (prefill) or the rank declares
//                     the arrived data failed (decode)                          -> transfer_error
//        decode_fail  the decode rank fails the room on admission (decode only)  -> injected
//        prefill_fail the prefill rank fails the room itself when the room arrives, before it
//                     sends anything (prefill only). Unlike transfer it needs no write of its
//                     own, so it also hits a rank that writes nothing (an MLA prefill rank that
//                     is no decode rank's source, a replica of a replicated KV head) -> injected
//        timeout      the rank's peer stays silent for the room: prefill         -> bootstrap_timeout,
//                     decode                                                     -> waiting_timeout
//        abort        the router aborts the room at the decode leader            -> aborted
//        peer_death   the orchestrator SIGKILLs the rank's process and restarts it (once only)
//        restart      restart@RANK[:once]: as peer_death, but the rank comes back on the same
//                     address and every port its peers know (control, engine, metrics): a new
//                     incarnation on the old endpoints (kvferry/messages.h)
//        link_down    link_down@HOST:MS: every non-loopback link of the host goes down for MS ms
//        partition    partition@HOST:MS: packets to and from the host are dropped for MS ms
//                     (HOST: a key of the --hosts file; net_fault_executor.h carries them out)
//        corrupt      at a decode rank: each prefill source of it flips one byte of its first write
//                     of the room to it in flight, unreported by the transport; needs
//                     --integrity (the decode rank's check)                     -> integrity_error
//        pause        pause@RANK:MS: the rank's process is stopped (SIGSTOP) for MS ms, then runs
//                     on (SIGCONT): alive but silent, a false death to its peers once MS passes
//                     their patience; needs no --hosts (net_fault_executor.h)
// PLACE  absent (any rank the kind can act on), a role ("prefill", "decode": a rank of that role),
//        or a rank ("prefill/tp1"). A role or absent place is resolved per fault, seeded.
//        abort always acts at the decode leader (decode/tp0); decode_fail only on decode ranks,
//        prefill_fail only on prefill ranks.
// RATE   probability per request in [0, 1]; the rates of all items add up to at most 1: each
//        request draws once against their sum and gets at most one fault.
// once   per-room kinds: exactly one request (seeded) gets it; peer_death and restart: one kill
//        of the rank while 30-60% of the requests have been dispatched (seeded).
// MS     link_down, partition and pause: the fault's length in ms (1..600000), injected once
//        while 30-60% of the requests have been dispatched (seeded, plan_net_faults()).
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "driver/engine_protocol.h"
#include "kvferry/error.h"

namespace kvferry::replay {

struct FaultItem {
  std::string kind;   // transfer | decode_fail | prefill_fail | timeout | abort | peer_death |
                      // restart | link_down | partition
  std::string place;  // "" | "prefill" | "decode" | a rank string | a host key (net kinds)
  double rate = 0;    // when !once and not a net kind
  bool once = false;
  int64_t ms = 0;     // link_down, partition, pause: how long
  bool is_net() const { return kind == "link_down" || kind == "partition"; }
  bool is_timed() const { return is_net() || kind == "pause"; }  // KIND@PLACE:MS
};

struct FaultPlan {
  std::vector<FaultItem> items;
  bool empty() const { return items.empty(); }
  bool has_peer_death() const;  // peer_death or restart
  bool has_net_faults() const;   // link_down or partition
  bool has_pauses() const;       // pause
  double total_rate() const;
  std::string str() const;  // canonical spec text (parses back to the same plan)
};

// Parses and checks `spec` against the cluster (ranks must exist). An empty spec is an empty
// plan. kInvalidArgument naming the offending item for anything else.
// Data parallelism: a per-room fault's rank names no DP group (the router places it in the
// group that serves the room, router.h plan_requests()); a peer_death's may
// ("peer_death@decode/tp1/dp1:once"; without one: DP group 0).
Result<FaultPlan> parse_fault_plan(const std::string& spec, uint32_t prefill_tp,
                                   uint32_t decode_tp, uint32_t prefill_dp = 1,
                                   uint32_t decode_dp = 1);

// `--fault-rate P`: transfer@prefill:P/2,decode_fail@decode:P/2 (empty plan for P == 0).
FaultPlan fault_rate_plan(double p);

// Expected failure of a per-room fault: origin is the fault's rank, code as above.
std::string expected_code(const FaultSpec& fault);

// Assigns per-room faults to `count` requests (index -> fault; nullopt: none), seeded.
// abort resolves to {"abort", "decode/tp0"}.
std::vector<std::optional<FaultSpec>> assign_room_faults(const FaultPlan& plan, size_t count,
                                                         uint64_t seed, uint32_t prefill_tp,
                                                         uint32_t decode_tp);

// One planned kill: the rank, and how many requests are dispatched before it is asked for.
struct PlannedPeerDeath {
  std::string rank;
  uint64_t after_dispatched = 0;
  bool same_ports = false;  // restart@: back on the ports the killed process had bound
};
// The plan's peer deaths for `count` requests (count >= 2), seeded, ordered by after_dispatched.
std::vector<PlannedPeerDeath> plan_peer_deaths(const FaultPlan& plan, size_t count, uint64_t seed,
                                               uint32_t prefill_tp, uint32_t decode_tp);

// Ranks the plan restarts on their own ports (restart@RANK items), as RankId::str().
std::vector<std::string> same_port_restarts(const FaultPlan& plan);

// One planned network fault: injected once `after_dispatched` requests went out, healed `ms` later.
struct PlannedNetFault {
  std::string kind;  // link_down | partition | pause
  std::string host;  // a key of the --hosts file; pause: the rank (RankId::str())
  int64_t ms = 0;
  uint64_t after_dispatched = 0;
};
// The plan's network faults and pauses for `count` requests (count >= 2), seeded (30-60% dispatched),
// ordered by after_dispatched.
std::vector<PlannedNetFault> plan_net_faults(const FaultPlan& plan, size_t count, uint64_t seed);

// Milliseconds from a request's dispatch to its abort frame (seeded per room, 2..10 ms).
double abort_delay_ms(uint64_t seed, uint64_t room);

}  // namespace kvferry::replay
