// The command lines of `kvferry replay`'s child processes (orchestrator.h): the bootstrap
// service, every prefill and decode rank, the router; the ports each learns from the others and
// the rank and file names used in DIR/logs.
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvferry/error.h"
#include "replay/replay_config.h"

namespace kvferry::replay {

// argv of each child process (exposed for tests). A listening child whose port is 0 here binds
// any free port and writes the port it got to a port file (kvferry/port_file.h) in DIR/logs:
// bootstrap.port, router.port, <rank file>.port for an engine leader. The orchestrator starts
// the children in the order that lets each learn the ports it needs: bootstrap, router, the
// leaders, then their followers (with the leader's bound port). No port is picked ahead of its
// bind, so no other process can take it in between.
struct Ports {
  uint16_t bootstrap = 0, router = 0;
  uint16_t orchestrator = 0;  // 0: no peer deaths planned (the router gets no --orchestrator)
  // Engine endpoint of each DP group's leader, index = DP rank (missing or 0: bind any port).
  // xPyD: the orchestrator passes each instance's own (and, for a prefill instance's ranks, its
  // own bootstrap port in `bootstrap`; decode ranks get instance 0's as their default).
  std::vector<uint16_t> prefill_engines, decode_engines;
  // xPyD: every prefill instance's bootstrap port (index = instance), for the router.
  std::vector<uint16_t> prefill_bootstraps;
};
// A rank's name ("prefill/tp1", "decode/tp0/dp1": RankId::str(), the DP group only when not 0,
// as in every error's origin) and its file name in DIR/logs ("prefill-tp1", "decode-tp0-dp1").
// xPyD: instance I > 0 is the RankId's engine id ("decode1/tp0", file "decode1-tp0"): a decode
// rank's own id; a prefill rank is engine 0 in the library (its origins read "prefill/tp0"), the
// instance in its name is the replay's (the report names it so: report.h "Instances").
std::string rank_name(bool prefill, uint32_t tp_rank, uint32_t dp_rank, uint32_t instance = 0);
std::string rank_file(bool prefill, uint32_t tp_rank, uint32_t dp_rank, uint32_t instance = 0);
// The bootstrap service of prefill instance I: file "bootstrap" (I = 0), "bootstrap1", ...
std::string bootstrap_file(uint32_t instance);
std::vector<std::string> bootstrap_args(const ReplayConfig& c, const Ports& p, uint32_t instance = 0);
std::vector<std::string> rank_args(const ReplayConfig& c, const Ports& p, bool prefill,
                                   uint32_t tp_rank, uint32_t dp_rank = 0, uint32_t instance = 0);
std::vector<std::string> router_args(const ReplayConfig& c, const Ports& p);

// --hosts (hosts.h): the host a child runs on, by its file name ("bootstrap", "router",
// "decode-tp1-dp1"); nullptr without --hosts (or for an unknown name).
const HostEntry* child_host(const ReplayConfig& c, const std::string& file);
// That host's address (kDefaultHost without one) and exec prefix (empty without one): every
// child is started through its host's prefix (process.h ProcessGroup::spawn).
std::string child_address(const ReplayConfig& c, const std::string& file);
std::vector<std::string> child_exec(const ReplayConfig& c, const std::string& file);
// The address a child binds and advertises, and the one its peers connect to: its host's
// address, kDefaultHost without --hosts.
std::string bootstrap_address(const ReplayConfig& c);
std::string router_address(const ReplayConfig& c);
std::string replay_address(const ReplayConfig& c);  // the orchestrator's socket
std::string rank_address(const ReplayConfig& c, bool prefill, uint32_t tp_rank, uint32_t dp_rank);

// --hosts: one line per host, "replay: host h1 (10.71.0.1): bootstrap, router, prefill/tp0\n";
// "" without --hosts.
std::string placement_text(const ReplayConfig& c);

// DIR/logs: every child's log, stderr and port files.
std::string logs_dir(const ReplayConfig& c);

// restart@RANK (fault_plan.h): such a rank writes its control port to DIR/logs/<file>.control.port
// and (a follower) its engine port to DIR/logs/<file>.port; restart_ports() reads them, and the
// metrics port (--metrics), back as the arguments that make the restarted process bind the same
// ports: "--control-port P [--engine-port E] [--metrics-port M]". The heartbeat socket only sends
// (no peer knows its port) and the transport's worker address is new by nature (peers get it in
// the new registration): neither is pinned. Errors: a port file is missing (kInternal).
std::string control_port_file(const ReplayConfig& c, const std::string& file);
Result<std::vector<std::string>> restart_ports(const ReplayConfig& c, const std::string& file);
// A rank's name from its file name ("decode-tp1-dp2" -> "decode/tp1/dp2").
std::string file_rank_name(const std::string& file);

}  // namespace kvferry::replay
