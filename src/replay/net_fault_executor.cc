// Network faults on the test hosts (net_fault_executor.h).
#include "replay/net_fault_executor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <ostream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "replay/results.h"

extern char** environ;

namespace kvferry::replay {

std::vector<std::string> on_host(const NetHost& host, const std::vector<std::string>& cmd) {
  std::vector<std::string> argv = host.exec;
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  return argv;
}

Result<std::vector<std::string>> parse_links(const std::string& ip_json) {
  const auto j = nlohmann::json::parse(ip_json, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return Status(ErrorCode::kInvalidArgument, "ip -j link: not a JSON array");
  std::vector<std::string> links;
  for (const auto& e : j) {
    if (!e.is_object() || !e.contains("ifname") || !e["ifname"].is_string())
      return Status(ErrorCode::kInvalidArgument, "ip -j link: an entry without a string ifname");
    const std::string name = e["ifname"];
    const std::string type = e.value("link_type", std::string());
    if (name == "lo" || type == "loopback") continue;
    links.push_back(name);
  }
  return links;
}

std::string partition_ruleset() {
  return fmt::format(
      "table inet {0} {{\n"
      "  chain input {{ type filter hook input priority -300; policy drop; iif \"lo\" accept; }}\n"
      "  chain output {{ type filter hook output priority -300; policy drop; oif \"lo\" accept; }}\n"
      "}}\n",
      kPartitionTable);
}

Result<std::string> run_command(const std::vector<std::string>& argv, int timeout_ms) {
  if (argv.empty()) return Status(ErrorCode::kInvalidArgument, "empty command");
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Status(ErrorCode::kInternal, "pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  const std::string shown = fmt::format("{}", fmt::join(argv, " "));
  if (rc != 0) {
    ::close(out[0]);
    return Status(ErrorCode::kInternal, fmt::format("cannot run {}: {}", shown, strerror(rc)));
  }
  std::string text;
  const int64_t deadline = monotonic_ns() + int64_t(timeout_ms) * 1'000'000;
  bool timed_out = false;
  for (;;) {
    const int64_t left = (deadline - monotonic_ns()) / 1'000'000;
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, int(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    if (text.size() < (1u << 20)) text.append(buf, size_t(n));
  }
  ::close(out[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (timed_out) return Status(ErrorCode::kInternal, fmt::format("{} did not finish within {} ms", shown, timeout_ms));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status(ErrorCode::kInternal, fmt::format("{} failed: {}", shown, text));
  return text;
}

NetFaultExecutor::NetFaultExecutor(std::vector<PlannedNetFault> plan, std::map<std::string, NetHost> hosts,
                                   std::string work_dir, std::ostream& out, PidOf pid_of)
    : plan_(std::move(plan)), hosts_(std::move(hosts)), work_dir_(std::move(work_dir)), out_(out),
      pid_of_(std::move(pid_of)) {
  for (const auto& p : plan_) records_.push_back({p.kind, p.host, p.ms, 0, 0, {}, ""});
}

NetFaultExecutor::~NetFaultExecutor() { heal_all(); }

Status NetFaultExecutor::poll(uint64_t dispatched, int64_t now_ns) {
  for (size_t i = 0; i < plan_.size(); ++i) {
    NetFaultRecord& r = records_[i];
    if (r.start_ns == 0 && r.error.empty() && dispatched >= plan_[i].after_dispatched) {
      if (Status s = inject(i, now_ns); !s.ok()) return s;
    } else if (r.start_ns != 0 && r.end_ns == 0 && now_ns - r.start_ns >= r.ms * 1'000'000) {
      if (Status s = heal(i, now_ns); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

Status NetFaultExecutor::inject(size_t i, int64_t now_ns) {
  NetFaultRecord& r = records_[i];
  if (r.kind == "pause") {
    const std::optional<int> pid = pid_of_ ? pid_of_(r.host) : std::nullopt;
    if (!pid || ::kill(*pid, SIGSTOP) != 0) {
      r.error = pid ? fmt::format("cannot stop {} (pid {}): {}", r.host, *pid, strerror(errno))
                    : r.host + " has no running process";
      return Status(ErrorCode::kInternal, r.error);
    }
    paused_[i] = *pid;
    r.start_ns = now_ns;
    out_ << fmt::format("replay: pause: {} (pid {}) stopped for {} ms\n", r.host, *pid, r.ms) << std::flush;
    return Status::Ok();
  }
  auto host = hosts_.find(r.host);
  if (host == hosts_.end()) {
    r.error = "no host " + r.host + " in the hosts file";
    return Status(ErrorCode::kInvalidArgument, r.error);
  }
  if (r.kind == "link_down") {
    r.links = host->second.links;
    if (r.links.empty()) {
      auto listed = run_command(on_host(host->second, {"ip", "-j", "link"}));
      if (!listed.ok()) return r.error = listed.status().message(), listed.status();
      auto links = parse_links(*listed);
      if (!links.ok()) return r.error = links.status().message(), links.status();
      r.links = *links;
    }
    if (r.links.empty()) {
      r.error = r.host + " has no link but loopback";
      return Status(ErrorCode::kInvalidArgument, r.error);
    }
    for (const auto& link : r.links) {
      auto s = run_command(on_host(host->second, {"ip", "link", "set", "dev", link, "down"}));
      if (!s.ok()) return r.error = s.status().message(), s.status();
    }
  } else {
    const std::string path = fmt::format("{}/partition-{}.nft", work_dir_, r.host);
    {
      std::ofstream f(path, std::ios::trunc);
      f << partition_ruleset();
      if (!f.flush()) return r.error = "cannot write " + path, Status(ErrorCode::kInternal, r.error);
    }
    auto s = run_command(on_host(host->second, {"nft", "-f", path}));
    if (!s.ok()) return r.error = s.status().message(), s.status();
  }
  r.start_ns = now_ns;
  out_ << fmt::format("replay: network fault: {} of {} for {} ms{}\n", r.kind, r.host, r.ms,
                      r.links.empty() ? "" : fmt::format(" ({})", fmt::join(r.links, ", ")))
       << std::flush;
  return Status::Ok();
}

Status NetFaultExecutor::heal(size_t i, int64_t now_ns) {
  NetFaultRecord& r = records_[i];
  if (r.kind == "pause") {
    const int pid = paused_.at(i);
    const bool ok = ::kill(pid, SIGCONT) == 0;
    paused_.erase(i);
    r.end_ns = now_ns;
    if (!ok) r.error = fmt::format("heal: cannot continue {} (pid {}): {}", r.host, pid, strerror(errno));
    out_ << fmt::format("replay: pause: {} runs again after {:.0f} ms\n", r.host, double(r.end_ns - r.start_ns) / 1e6)
         << std::flush;
    return ok ? Status::Ok() : Status(ErrorCode::kInternal, r.error);
  }
  const NetHost& host = hosts_.at(r.host);
  Status first = Status::Ok();
  if (r.kind == "link_down") {
    for (const auto& link : r.links) {
      auto s = run_command(on_host(host, {"ip", "link", "set", "dev", link, "up"}));
      if (!s.ok() && first.ok()) first = s.status();
    }
  } else {
    auto s = run_command(on_host(host, {"nft", "delete", "table", "inet", kPartitionTable}));
    if (!s.ok()) first = s.status();
  }
  r.end_ns = now_ns;
  if (!first.ok()) r.error = "heal: " + first.message();
  out_ << fmt::format("replay: network fault: {} of {} healed after {:.0f} ms\n", r.kind, r.host,
                      double(r.end_ns - r.start_ns) / 1e6)
       << std::flush;
  return first;
}

void NetFaultExecutor::heal_all() {
  for (size_t i = 0; i < records_.size(); ++i)
    if (records_[i].start_ns != 0 && records_[i].end_ns == 0) (void)heal(i, monotonic_ns());
}

std::map<std::string, std::string> rank_hosts(const HostsFile& hf, uint32_t prefill_dp, uint32_t decode_dp) {
  std::map<std::string, std::string> m;
  for (bool prefill : {true, false}) {
    const uint32_t tp = prefill ? hf.prefill_tp : hf.decode_tp, dp = prefill ? prefill_dp : decode_dp;
    for (uint32_t g = 0; g < dp; ++g)
      for (uint32_t r = 0; r < tp; ++r)
        m[RankId{prefill ? Role::kPrefill : Role::kDecode, 0, r, g}.str()] = hf.rank(prefill, r, g).name;
  }
  return m;
}

uint64_t dispatched_so_far(const std::string& out_dir) {
  std::ifstream in(out_dir + "/results.json.progress", std::ios::binary);
  if (!in) return 0;
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = decode_results(ss.str());
  if (!r.ok()) return 0;
  uint64_t n = 0;
  for (const auto& q : r->requests) n += q.dispatched_ns != 0;
  return n;
}

}  // namespace kvferry::replay
