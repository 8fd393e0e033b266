// `kvferry replay --hosts` across test hosts (tests/hosts/hosts.sh: network namespaces joined by
// a bridge, each its own address; README "Across hosts"). Each case brings up its own hosts,
// named from this process's pid (so concurrent test binaries never share one), and takes them
// down again. Checked from the report, results.json and every process's log:
//   - 2+2 over tcp, prefill on h1 and decode on h2, per-room faults: every byte verified, every
//     fault attributed to its injected origin with exactly one line above debug, nothing
//     unexpected, nothing leaked, the placement in the report's config;
//   - 2+2 with the two prefill ranks on different hosts (and decode on a third);
//   - peer death of decode/tp1 on h2, the replay running on h1: each detecting engine logs one
//     peer_dead line, every failed room names the dead rank, the rank restarted on h2 is used again.
// Namespaces need root and iproute2: without them each case fails saying so, unless
// KVFERRY_NO_NETNS=1 is set (then it is skipped with the reason).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>

#include "replay_harness.h"

namespace kvferry_itest {
namespace {

const std::string kAzure = KVFERRY_SOURCE_DIR "/data/traces/AzureLLMInferenceTrace_code.csv";
const std::string kHostsSh = KVFERRY_SOURCE_DIR "/tests/hosts/hosts.sh";

// Why this machine cannot make test hosts ("" when it can).
std::string no_netns_reason() {
  if (::geteuid() != 0) return "network namespaces need root (this is uid " + std::to_string(::geteuid()) + ")";
  if (std::system("command -v ip >/dev/null 2>&1") != 0) return "'ip' (iproute2) is not installed";
  return "";
}

class MultiHost : public ReplayDir {
 protected:
  void SetUp() override {
    ReplayDir::SetUp();
    if (const std::string why = no_netns_reason(); !why.empty()) {
      const char* opt_out = std::getenv("KVFERRY_NO_NETNS");
      if (opt_out && std::string(opt_out) == "1") GTEST_SKIP() << "KVFERRY_NO_NETNS=1: " << why;
      FAIL() << "the multi-host tests cannot run: " << why
             << " (run as root, or set KVFERRY_NO_NETNS=1 to skip them)";
    }
    prefix_ = "kt" + std::to_string(::getpid() % 100000);
    subnet_ = "10.72." + std::to_string(::getpid() % 250);
  }
  void TearDown() override {
    if (up_) {
      EXPECT_EQ(shell(kHostsSh + " down " + prefix_), 0) << "hosts.sh down " << prefix_;
    }
    ReplayDir::TearDown();
  }
  int shell(const std::string& cmd) {
    const std::string full = "KVF_HOSTS_SUBNET=" + subnet_ + " " + cmd + " >>" + (dir_ / "hosts.log").string() + " 2>&1";
    const int st = std::system(full.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  // N hosts h1..hN; `prefill`/`decode`: host keys per rank, comma-separated.
  void up(int n, const std::string& prefill, const std::string& decode) {
    up_ = true;
    ASSERT_EQ(shell(kHostsSh + " up " + std::to_string(n) + " " + prefix_ + " --prefill " + prefill +
                    " --decode " + decode + " --json " + hosts_file().string()),
              0)
        << slurp(dir_ / "hosts.log");
  }
  fs::path hosts_file() const { return dir_ / "hosts.json"; }
  std::string ns(int i) const { return prefix_ + "h" + std::to_string(i); }
  std::string address(int i) const { return subnet_ + "." + std::to_string(i); }

  // The replay with --hosts, run on host `on` (ip netns exec), or here in the root namespace
  // (on = 0), which reaches no host: only the children it starts through their prefix do.
  CliRun replay_on(int on, std::vector<std::string> args) {
    args.insert(args.begin(), "replay");
    args.insert(args.end(), {"--transport", "tcp", "--hosts", hosts_file().string(),
                             "--out", out().string()});
    if (on == 0) return run_cli(args, dir_ / "output.txt");
    std::vector<std::string> all = {"netns", "exec", ns(on), KVFERRY_CLI};
    all.insert(all.end(), args.begin(), args.end());
    const auto t0 = std::chrono::steady_clock::now();
    CliRun r;
    r.exit_code = wait_cli(start_program("ip", all, dir_ / "output.txt"));
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.output = slurp(dir_ / "output.txt");
    return r;
  }
  // A clean replay: every request accounted for, every byte verified, every fault attributed with
  // one line above debug (counted here from the logs), nothing unexpected, nothing leaked, and the
  // placement recorded in the config.
  void expect_clean(const CliRun& run, uint64_t total) {
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const json r = report();
    EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
    const auto& q = r["requests"];
    EXPECT_EQ(q["total"].get<uint64_t>(), total);
    EXPECT_EQ(q["succeeded"].get<uint64_t>() + q["failed"].get<uint64_t>() + q["rejected"].get<uint64_t>(), total);
    EXPECT_GT(q["succeeded"].get<uint64_t>(), 0u);
    EXPECT_EQ(r["bytes"]["mismatched"].get<uint64_t>(), 0u);
    EXPECT_GT(r["bytes"]["verified"].get<uint64_t>(), 0u);
    EXPECT_GT(r["throughput_gb_per_s"].get<double>(), 0.0);
    EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();
    EXPECT_EQ(r["config"]["transport"], "tcp");
    EXPECT_EQ(r["config"]["hosts"]["hosts"], json::parse(slurp(hosts_file()))["hosts"]);
    EXPECT_EQ(r["config"]["hosts_file"], hosts_file().string());
    const Logs logs = read_logs(out());
    EXPECT_TRUE(logs.bad.empty()) << logs.bad.size() << " bad log lines, first: " << logs.bad[0];
    for (const auto& f : r["faults"]) {
      const std::string room = f["room"].get<std::string>();
      EXPECT_EQ(f["observed_origin"], f["injected_at"]) << f.dump();
      const int counted = logs.above_debug_by_room.count(room) ? logs.above_debug_by_room.at(room) : 0;
      EXPECT_EQ(counted, 1) << "room " << room << " has " << counted << " lines above debug";
      EXPECT_EQ(f["lines_above_debug"].get<int>(), counted);
      EXPECT_GT(f["ranks_failed"].get<int>(), 0);
    }
    EXPECT_EQ(r["faults"].size(), q["failed"].get<size_t>());  // every failed room is a fault's
    expect_no_leaks(r);
  }

  // The replay printed which host runs what, with each host's address.
  void expect_placed(const CliRun& run, int host, const std::string& what) {
    const std::string line = "replay: host h" + std::to_string(host) + " (" + address(host) + "): " + what + "\n";
    EXPECT_NE(run.output.find(line), std::string::npos) << line << run.output;
  }

  std::string prefix_, subnet_;
  bool up_ = false;
};

TEST_F(MultiHost, TcpTwoByTwoAcrossTwoHostsWithFaults) {
  up(2, "h1,h1", "h2,h2");
  const CliRun run = replay_on(0, {"--trace", kAzure, "--model", "Qwen2.5-7B", "--prefill-tp", "2", "--decode-tp",
                                   "2", "--max-requests", "40", "--pool-mib", "256", "--prefill-pool-mib", "64",
                                   "--page-size", "16", "--fault-rate", "0.2", "--seed", "3"});
  expect_clean(run, 40);
  expect_placed(run, 1, "the replay (orchestrator), bootstrap, router, prefill/tp0, prefill/tp1");
  expect_placed(run, 2, "decode/tp0, decode/tp1");
  const json r = report();
  EXPECT_GT(r["faults"].size(), 0u);
  EXPECT_EQ(r["config"]["hosts"]["place"]["decode"], json::array({"h2", "h2"}));
  EXPECT_EQ(r["config"]["hosts"]["hosts"]["h2"]["address"], address(2));
}

// The prefill engine's agreement (leader on h1, follower on h2) crosses hosts here. On this busy
// 2-core machine the follower's engine thread was seen silent for 600-930 ms at the first rooms
// (its UCX connects to the decode ranks on h3 run on that thread: issue 12 item 4), past the
// default --engine-timeout-ms 600; this case is about placement, so it gives the agreement 5 s.
TEST_F(MultiHost, PrefillRanksOnDifferentHosts) {
  up(3, "h1,h2", "h3,h3");
  const CliRun run = replay_on(1, {"--trace", kAzure, "--model", "Qwen2.5-7B", "--prefill-tp", "2", "--decode-tp",
                                   "2", "--max-requests", "30", "--pool-mib", "256", "--prefill-pool-mib", "64",
                                   "--page-size", "16", "--fault-rate", "0.1", "--seed", "4", "--metrics",
                                   "--engine-timeout-ms", "5000"});
  expect_clean(run, 30);
  // Every rank's metrics URL is on its host's address.
  const json metrics = json::parse(slurp(out() / "metrics.json"));
  for (auto [rank, host] : {std::pair{"prefill/tp0", 1}, std::pair{"prefill/tp1", 2}, std::pair{"decode/tp1", 3}}) {
    EXPECT_EQ(metrics[rank]["url"].get<std::string>().rfind("http://" + address(host) + ":", 0), 0u)
        << metrics.dump();
  }
  expect_placed(run, 1, "the replay (orchestrator), bootstrap, router, prefill/tp0");
  expect_placed(run, 2, "prefill/tp1");
  expect_placed(run, 3, "decode/tp0, decode/tp1");
}

// decode/tp1 on h2 is SIGKILLed while rooms are in flight and restarted 1.5 s later, on h2 again
// (through its exec prefix); the replay runs on h1, where the router reaches its socket.
TEST_F(MultiHost, PeerDeathOfARankOnAnotherHost) {
  up(2, "h1,h1", "h2,h2");
  const std::string rank = "decode/tp1";
  const fs::path trace = write_trace(120, 100, {100, 150, 200, 300});
  const CliRun run = replay_on(1, {"--trace", trace.string(), "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                                   "--decode-tp", "2", "--pool-mib", "256", "--prefill-pool-mib", "64",
                                   "--page-size", "16", "--time-scale", "1", "--seed", "2", "--faults",
                                   "peer_death@" + rank + ":once", "--engine-timeout-ms", "600",
                                   "--restart-delay-ms", "1500"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("peer death: restarted " + rank), std::string::npos) << run.output;
  const json r = report();
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  ASSERT_EQ(r["peer_deaths"].size(), 1u);
  const json& d = r["peer_deaths"][0];
  EXPECT_EQ(d["rank"], rank);
  EXPECT_EQ(d["restarted"], true);
  EXPECT_EQ(d["expected_engines"], json::array({"decode", "prefill"}));
  EXPECT_EQ(d["detections"].size(), 2u) << d.dump();
  EXPECT_EQ(d["lines_above_debug"], 2);
  EXPECT_EQ(d["rooms_misattributed"], 0) << d.dump();
  EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();
  EXPECT_TRUE(r["unexplained_peer_dead"].empty()) << r["unexplained_peer_dead"].dump();
  const int64_t killed = d["killed_mono_ns"], restarted = d["restarted_mono_ns"];

  // One peer_dead line above debug per detecting engine, after the kill, naming the dead rank.
  const LogLines logs = read_log_lines(out());
  EXPECT_TRUE(logs.bad.empty()) << logs.bad.front();
  std::map<std::string, int> by_engine;
  for (const auto& l : logs.lines) {
    if (l.value("event", "") != "peer_dead" || !LogLines::above_debug(l)) continue;
    EXPECT_EQ(l["peer"], rank) << l.dump();
    EXPECT_GT(l["mono_ns"].get<int64_t>(), killed) << l.dump();
    const std::string by = l["rank"];
    ++by_engine[by.substr(0, by.find('/'))];
  }
  EXPECT_EQ(by_engine, (std::map<std::string, int>{{"decode", 1}, {"prefill", 1}}));

  // Every failed room names the dead rank; rooms dispatched after the restart succeed.
  size_t failed = 0, ok_after_restart = 0;
  const json res = results();
  for (const auto& q : res["requests"]) {
    const bool ok = q["prefill"].is_object() && q["decode"].is_object() && q["prefill"]["state"] == "Success" &&
                    q["decode"]["state"] == "Success";
    if (ok) {
      ok_after_restart += q["dispatched_ns"].get<int64_t>() > restarted;
      continue;
    }
    ++failed;
    for (const char* engine : {"prefill", "decode"}) {
      if (!q[engine].is_object() || q[engine]["state"] != "Failed") continue;
      EXPECT_EQ(q[engine]["origin"], rank) << engine << " " << q.dump();
      EXPECT_EQ(q[engine]["code"], "peer_unreachable") << engine << " " << q.dump();
    }
  }
  EXPECT_GE(failed, 1u);
  EXPECT_EQ(d["rooms_failed"].get<size_t>(), failed);
  EXPECT_GE(ok_after_restart, 3u);
  EXPECT_EQ(r["bytes"]["mismatched"], 0);
  expect_no_leaks(r);
}

// Refused before anything starts, each with its reason: shared memory across hosts, and a replay
// with peer deaths that does not run on the host the router reaches it at.
TEST_F(MultiHost, WrongTransportOrReplayHostIsExplained) {
  up(2, "h1,h1", "h2,h2");
  const std::vector<std::string> args = {"replay", "--trace", kAzure, "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                                         "--decode-tp", "2", "--max-requests", "4", "--pool-mib", "256",
                                         "--prefill-pool-mib", "64", "--page-size", "16", "--hosts",
                                         hosts_file().string(), "--out", out().string()};
  std::vector<std::string> shm = args;
  shm.insert(shm.end(), {"--transport", "shm"});
  CliRun run = run_cli(shm, dir_ / "output.txt");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--transport shm needs the prefill and decode ranks on one host, but --hosts " +
                            hosts_file().string() + " places prefill/tp0 on h1 and decode/tp0 on h2"),
            std::string::npos)
      << run.output;
  // Here, in the root namespace, h1's address does not exist: the orchestrator cannot bind it.
  std::vector<std::string> death = args;
  death.insert(death.end(), {"--transport", "tcp", "--faults", "peer_death@decode/tp1:once"});
  run = run_cli(death, dir_ / "output.txt");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("cannot bind the orchestrator's socket on " + address(1)), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("peer_death needs the replay on host h1 (" + address(1) +
                            ", --hosts place.replay, default the router's host): run it there, e.g. `ip netns "
                            "exec " + ns(1) + " kvferry replay ...`"),
            std::string::npos)
      << run.output;
  EXPECT_TRUE(processes_mentioning(out().string()).empty());  // nothing was started
}

}  // namespace
}  // namespace kvferry_itest
