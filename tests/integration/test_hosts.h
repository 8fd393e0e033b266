// A fixture that makes test hosts (tests/hosts/hosts.sh: network namespaces joined by a bridge,
// README "Across hosts") for one test and takes them down again, and runs `kvferry replay
// --hosts` on one of them. Names are "knf<pid>" (namespaces knf<pid>h1.., bridge knf<pid>br),
// subnet 10.71.0 (host i is 10.71.0.i): each bridge is its own L2 domain, so test binaries
// running at once never share a host. Namespaces need root and iproute2: without them the test
// fails saying so, unless KVFERRY_NO_NETNS=1 is set (then it is skipped with the reason).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "replay_harness.h"

namespace kvferry_itest {

inline const std::string kHostsScript = KVFERRY_SOURCE_DIR "/tests/hosts/hosts.sh";

// Why this machine cannot make test hosts ("" when it can).
inline std::string netns_unavailable() {
  if (::geteuid() != 0) return "network namespaces need root (this is uid " + std::to_string(::geteuid()) + ")";
  if (std::system("command -v ip >/dev/null 2>&1") != 0) return "'ip' (iproute2) is not installed";
  return "";
}

class TestHosts : public ReplayDir {
 protected:
  void SetUp() override {
    ReplayDir::SetUp();
    if (const std::string why = netns_unavailable(); !why.empty()) {
      const char* opt_out = std::getenv("KVFERRY_NO_NETNS");
      if (opt_out && std::string(opt_out) == "1") GTEST_SKIP() << "KVFERRY_NO_NETNS=1: " << why;
      FAIL() << "the test-host tests cannot run: " << why << " (run as root, or set KVFERRY_NO_NETNS=1 to skip them)";
    }
    prefix_ = "knf" + std::to_string(::getpid() % 100000);
  }
  void TearDown() override {
    if (up_) {
      EXPECT_EQ(shell(kHostsScript + " down " + prefix_), 0) << "hosts.sh down " << prefix_;
    }
    ReplayDir::TearDown();
  }
  int shell(const std::string& cmd) {
    const std::string full =
        "KVF_HOSTS_SUBNET=" + subnet_ + " " + cmd + " >>" + (dir_ / "hosts.log").string() + " 2>&1";
    const int st = std::system(full.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  // N hosts h1..hN; `prefill`/`decode`: host keys per rank, comma-separated.
  void up(int n, const std::string& prefill, const std::string& decode) {
    up_ = true;
    ASSERT_EQ(shell(kHostsScript + " up " + std::to_string(n) + " " + prefix_ + " --prefill " + prefill +
                    " --decode " + decode + " --json " + hosts_file().string()),
              0)
        << slurp(dir_ / "hosts.log");
  }
  fs::path hosts_file() const { return dir_ / "hosts.json"; }
  std::string ns(int i) const { return prefix_ + "h" + std::to_string(i); }
  std::string address(int i) const { return subnet_ + "." + std::to_string(i); }

  // `kvferry replay ... --transport tcp --hosts FILE --out DIR` on host `on` (ip netns exec).
  CliRun replay_on(int on, std::vector<std::string> args) {
    std::vector<std::string> all = {"netns", "exec", ns(on), KVFERRY_CLI, "replay"};
    all.insert(all.end(), args.begin(), args.end());
    all.insert(all.end(), {"--transport", "tcp", "--hosts", hosts_file().string(), "--out", out().string()});
    const auto t0 = std::chrono::steady_clock::now();
    CliRun r;
    r.exit_code = wait_cli(start_program("ip", all, dir_ / "output.txt"));
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.output = slurp(dir_ / "output.txt");
    return r;
  }

  std::string prefix_;
  std::string subnet_ = "10.71.0";
  bool up_ = false;
};

}  // namespace kvferry_itest
