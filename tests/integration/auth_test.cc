// Issue 13: a replay with the cluster secret set (KVFERRY_SECRET_FILE, docs/security.md) runs
// clean, and while it runs the bootstrap service answers 401 to a request without a MAC of it and
// to one with the cluster's bearer token (200 with its MAC, core/request_mac.h), and every rank's
// metrics endpoint 401 without the bearer token (200 with it). A secret file others can read stops
// the replay before it starts anything.
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <thread>
#include <tuple>

#include "core/request_mac.h"
#include "core/secret.h"
#include "replay_harness.h"

namespace kvferry_itest {
namespace {

const std::string kTrace = KVFERRY_SOURCE_DIR "/data/traces/conversation_trace.jsonl";
const std::string kSecret = "integration test cluster secret, 0123456789abcdef";

// Sets KVFERRY_SECRET_FILE for the children started while it lives.
class SecretEnv {
 public:
  explicit SecretEnv(const fs::path& file) { ::setenv(kvferry::security::kSecretFileEnv, file.c_str(), 1); }
  ~SecretEnv() { ::unsetenv(kvferry::security::kSecretFileEnv); }
};

class Auth : public ReplayDir {
 protected:
  fs::path write_secret(mode_t mode) {
    const fs::path p = dir_ / "cluster.secret";
    std::ofstream(p) << kSecret << "\n";
    ::chmod(p.c_str(), mode);
    return p;
  }
};

// Status of GET `path` on 127.0.0.1:`port` (0: no answer), with `authorization` when not empty.
int get_status(int port, const std::string& path, const std::string& authorization = "") {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(5, 0);
  httplib::Headers h;
  if (!authorization.empty()) h.emplace("Authorization", authorization);
  auto res = c.Get(path.c_str(), h);
  return res ? res->status : 0;
}

std::optional<int> port_in(const fs::path& file) {
  std::ifstream in(file);
  int port = 0;
  if (in >> port && port > 0) return port;
  return std::nullopt;
}

TEST_F(Auth, ReplayWithSecretRunsCleanAndRefusesUnauthenticatedHttp) {
  auto keys = kvferry::security::derive_keys(kSecret);
  ASSERT_TRUE(keys.ok()) << keys.status().str();
  const std::string bearer = "Bearer " + keys->bearer_token;
  SecretEnv env(write_secret(0600));
  const pid_t pid = start_cli({"replay", "--trace", kTrace, "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                               "--decode-tp", "2", "--pool-mib", "1024", "--prefill-pool-mib", "256", "--page-size",
                               "16", "--max-requests", "30", "--seed", "5", "--metrics", "--out", out().string()},
                              dir_ / "output.txt");
  ASSERT_GT(pid, 0);
  // While it runs: the bootstrap port (from its port file) and each rank's metrics port.
  std::map<std::string, std::pair<int, int>> metrics_checked;  // rank -> (anonymous, with token)
  std::optional<std::tuple<int, int, int>> bootstrap_checked;  // anonymous, bearer token, MAC
  int rc = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
  while (std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      rc = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
      break;
    }
    if (!bootstrap_checked) {
      if (auto port = port_in(out() / "logs" / "bootstrap.port")) {
        const int anon = get_status(*port, "/health");
        if (anon != 0)
          bootstrap_checked = {anon, get_status(*port, "/health", bearer),
                               get_status(*port, "/health", kvferry::security::mac_authorization(*keys, "GET", "/health", ""))};
      }
    }
    if (metrics_checked.size() < 4 && fs::exists(out() / "metrics.json")) {
      json ports = json::parse(slurp(out() / "metrics.json"), nullptr, false);
      for (auto& [rank, m] : ports.is_object() ? ports.items() : json::object().items()) {
        if (metrics_checked.count(rank) || !m["port"].is_number()) continue;
        const int anon = get_status(m["port"].get<int>(), "/metrics");
        if (anon != 0) metrics_checked[rank] = {anon, get_status(m["port"].get<int>(), "/metrics", bearer)};
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (rc == -1) {
    kill(pid, SIGINT);
    wait_cli(pid);
  }
  ASSERT_EQ(rc, 0) << slurp(dir_ / "output.txt");
  ASSERT_TRUE(bootstrap_checked.has_value()) << "the bootstrap service was never reached while the replay ran";
  EXPECT_EQ(std::get<0>(*bootstrap_checked), 401);
  EXPECT_EQ(std::get<1>(*bootstrap_checked), 401);
  EXPECT_EQ(std::get<2>(*bootstrap_checked), 200);
  EXPECT_EQ(metrics_checked.size(), 4u) << "not every rank's metrics endpoint was reached while it ran";
  for (const auto& [rank, s] : metrics_checked) {
    SCOPED_TRACE(rank);
    EXPECT_EQ(s.first, 401);
    EXPECT_EQ(s.second, 200);
  }
  // Clean: no request failed (none injected; "rejected" are the trace's requests that can never
  // fit the pools, as without a secret), data verified, nothing left behind.
  const json r = report();
  const auto& q = r["requests"];
  EXPECT_EQ(q["total"].get<uint64_t>(), 30u);
  EXPECT_EQ(q["failed"].get<uint64_t>(), 0u) << q.dump();
  EXPECT_GT(q["succeeded"].get<uint64_t>(), 0u) << q.dump();
  EXPECT_EQ(q["succeeded"].get<uint64_t>() + q["rejected"].get<uint64_t>(), 30u) << q.dump();
  EXPECT_EQ(r["bytes"]["mismatched"].get<uint64_t>(), 0u);
  EXPECT_GT(r["bytes"]["verified"].get<uint64_t>(), 0u);
  EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();
  expect_no_leaks(r);
}

TEST_F(Auth, SecretFileOthersCanReadStopsTheReplay) {
  const fs::path secret = write_secret(0644);
  const CliRun run = run_cli({"replay", "--secret-file", secret.string(), "--trace", kTrace, "--model", "Qwen2.5-7B",
                              "--max-requests", "1", "--out", out().string()},
                             dir_ / "output.txt");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("chmod 600"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(out() / "logs")) << "the replay started before refusing the secret file";
}

}  // namespace
}  // namespace kvferry_itest
