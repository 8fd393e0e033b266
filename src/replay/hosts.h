// `kvferry replay --hosts FILE` (README "Across hosts"): which host every process of a replay
// runs on. The file:
//
//   {"hosts": {"h1": {"address": "10.71.0.1", "exec": ["ip", "netns", "exec", "kvhh1"],
//                     "links": ["eth0"]},
//              "h2": {"address": "10.71.0.2", "exec": ["ip", "netns", "exec", "kvhh2"]}},
//    "place": {"bootstrap": "h1", "router": "h1", "replay": "h1",
//              "prefill": ["h1", "h1"], "decode": ["h2", "h2"]}}
//
// hosts: key -> HostEntry. `address` (required): what every process on that host binds and
// advertises; an IPv4 or IPv6 literal or a host name, never a wildcard; no two hosts share one,
// and with more than one host none is loopback (a process would reach its own host through it).
// `exec` (optional): the argv prefix every process on that host is started through (it must exec
// the command in place, as `ip netns exec NS` does, so the orchestrator's pid, signals and
// PR_SET_PDEATHSIG reach the process itself); absent or empty: started as without --hosts.
// `links` (optional): the host's non-loopback network links (interface names as seen on that
// host), for network faults; absent: found through `exec`.
// place: a host key for the bootstrap service, the router, optionally the replay itself (the
// orchestrator's socket, which the router reaches; default: the router's host), and one per rank
// of each engine in global rank order: index = dp_rank * tp + tp_rank (DP groups one after the
// other, each its tp ranks in order).
//
// Thread contract: plain data and pure functions. Errors: kInvalidArgument with a message for the
// user that names the key and what is wrong (unknown keys are refused, not ignored).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::replay {

// One host of a --hosts file (also what network faults act on: exec prefix, links).
struct HostEntry {
  std::string name;                // its key in "hosts" ("h1")
  std::string address;             // bind and advertised host of every process there (no brackets)
  std::vector<std::string> exec;   // argv prefix (empty: none)
  std::vector<std::string> links;  // non-loopback links; empty: not given (find them through exec)
};

// Where each process runs: host keys (HostsFile::hosts).
struct Placement {
  std::string bootstrap;
  std::string router;
  std::string replay;  // the orchestrator's socket; the router's host unless given
  std::vector<std::string> prefill;  // index = dp_rank * prefill_tp + tp_rank
  std::vector<std::string> decode;   // index = dp_rank * decode_tp + tp_rank
};

inline constexpr size_t kMaxHostsFileBytes = 1 << 20;
inline constexpr size_t kMaxHosts = 256;
inline constexpr size_t kMaxExecArgs = 64;
inline constexpr size_t kMaxLinks = 64;

struct HostsFile {
  std::map<std::string, HostEntry> hosts;
  Placement place;
  uint32_t prefill_tp = 1, decode_tp = 1;  // set by check_placement()

  // The host of a key that parse_hosts() checked (place names only such keys).
  const HostEntry& host(const std::string& key) const { return hosts.at(key); }
  const HostEntry& bootstrap() const { return host(place.bootstrap); }
  const HostEntry& router() const { return host(place.router); }
  const HostEntry& replay() const { return host(place.replay); }
  const HostEntry& rank(bool prefill, uint32_t tp_rank, uint32_t dp_rank) const;
  // True when some prefill rank and some decode rank are on different hosts.
  bool engines_apart() const;
  // The file as read (keys in order, "replay" filled in): the report's config.
  std::string to_json() const;
};

// Parses and checks a hosts file's text: its shape, every key, every address, that `place` names
// only known hosts. The rank counts are checked by check_placement().
Result<HostsFile> parse_hosts(std::string_view text);
// Checks that `place` has one prefill entry per prefill rank (tp x dp) and one decode entry per
// decode rank, and stores the TP sizes (HostsFile::rank).
Status check_placement(HostsFile& hf, uint32_t prefill_tp, uint32_t prefill_dp, uint32_t decode_tp,
                       uint32_t decode_dp);
// Reads `path` (at most kMaxHostsFileBytes), parse_hosts() and check_placement(); messages start
// with "--hosts PATH: ".
Result<HostsFile> load_hosts_file(const std::string& path, uint32_t prefill_tp, uint32_t prefill_dp,
                                  uint32_t decode_tp, uint32_t decode_dp);

}  // namespace kvferry::replay
