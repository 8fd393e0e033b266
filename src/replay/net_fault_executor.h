// Network faults on the test hosts (fault plan kinds link_down@HOST:MS and partition@HOST:MS,
// fault_plan.h), carried out by the orchestrator while the replay runs (docs/report.md "Faults").
//
//   link_down  every non-loopback link of the host is set down (`ip link set dev IF down` through
//              the host's exec prefix, e.g. ["ip","netns","exec","NS"]) and up again MS ms later.
//              The links are the host entry's "links", or else the non-loopback ones `ip -j link`
//              lists in the host (parse_links()).
//   partition  packets to and from the host are silently dropped, not refused: an nftables table
//              (`nft -f`, partition_ruleset()) in the host's namespace with input and output
//              chains that drop everything but loopback. Removing the table heals. A silent
//              peer is what a cut cable or a dead switch looks like; a refused connection (an
//              iptables REJECT, a closed port) would be seen at once and test nothing.
//   pause      (not a network fault, but carried out the same way) the rank's process is sent
//              SIGSTOP, and SIGCONT MS ms later: alive, its sockets open, but silent (a host
//              starving it, a VM paused). The record's "host" is the rank.
// Each fault is injected once `after_dispatched` requests went out (plan_net_faults(), 30-60%,
// seeded) and healed `ms` later; heal_all() heals whatever is still in effect (the replay's end,
// an error, Ctrl-C), so a host is never left cut off.
// Thread contract: one thread (the orchestrator's main thread). Commands run synchronously, each
// bounded by kCommandTimeoutMs.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvferry/error.h"
#include "replay/fault_plan.h"
#include "replay/hosts.h"
#include "replay/report.h"

namespace kvferry::replay {

// The hosts are --hosts entries (replay/hosts.h HostEntry: exec prefix, optional links).
using NetHost = HostEntry;

constexpr int kCommandTimeoutMs = 5000;
constexpr const char* kPartitionTable = "kvferry_partition";

// `cmd` run on `host`: its exec prefix, then `cmd`.
std::vector<std::string> on_host(const NetHost& host, const std::vector<std::string>& cmd);
// The non-loopback link names in `ip -j link` output (JSON array of objects with "ifname" and
// "link_type"; "lo" and link_type "loopback" are left out). Errors: not such JSON.
Result<std::vector<std::string>> parse_links(const std::string& ip_json);
// The nftables ruleset of a partition: table inet kvferry_partition, input and output chains
// (filter hooks, policy drop) that accept only loopback.
std::string partition_ruleset();

// Runs argv (argv[0] looked up in PATH), waits at most `timeout_ms`, returns its stdout.
// Errors (kInternal): it could not start, exited non-zero (its output in the message), timed out.
Result<std::string> run_command(const std::vector<std::string>& argv, int timeout_ms = kCommandTimeoutMs);

class NetFaultExecutor {
 public:
  // `work_dir`: where the nftables ruleset file goes. Progress lines go to `out`.
  // `pid_of`: the running process of a rank (RankId::str()), for pause.
  using PidOf = std::function<std::optional<int>(const std::string& rank)>;
  NetFaultExecutor(std::vector<PlannedNetFault> plan, std::map<std::string, NetHost> hosts, std::string work_dir,
                   std::ostream& out, PidOf pid_of = {});
  ~NetFaultExecutor();  // heal_all()
  bool active() const { return !records_.empty(); }
  // Injects the faults due at `dispatched` requests, heals those whose time passed. Errors: a
  // fault could not be injected or healed (the replay stops; heal_all() still runs).
  Status poll(uint64_t dispatched, int64_t now_ns);
  void heal_all();
  const std::vector<NetFaultRecord>& records() const { return records_; }

 private:
  Status inject(size_t i, int64_t now_ns);
  Status heal(size_t i, int64_t now_ns);
  std::vector<PlannedNetFault> plan_;
  std::map<std::string, NetHost> hosts_;
  std::string work_dir_;
  std::ostream& out_;
  std::vector<NetFaultRecord> records_;
  PidOf pid_of_;
  std::map<size_t, int> paused_;  // record -> the pid stopped
};

// Every rank's host key (RankId::str() -> key), for the report's checks.
std::map<std::string, std::string> rank_hosts(const HostsFile& hf, uint32_t prefill_dp, uint32_t decode_dp);

// Requests dispatched so far, from the router's progress snapshot DIR/results.json.progress
// (0 before the first).
uint64_t dispatched_so_far(const std::string& out_dir);

}  // namespace kvferry::replay
