// `kvferry replay` end to end: real processes on loopback, checked from the outside (the report
// and every rank's JSON log, counted here independently of the report's own counts).
#include <signal.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "replay_harness.h"

namespace kvferry_itest {
namespace {

const std::string kAzure = KVFERRY_SOURCE_DIR "/data/traces/AzureLLMInferenceTrace_code.csv";
const std::string kConversation = KVFERRY_SOURCE_DIR "/data/traces/conversation_trace.jsonl";

class Replay : public ReplayDir {
 protected:
  // The invariants every clean replay must satisfy, checked from the report and the logs.
  void expect_clean(const CliRun& run, uint64_t total) {
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("report: " + (out() / "report.json").string()), std::string::npos)
        << run.output;
    const json r = report();
    const auto& q = r["requests"];
    EXPECT_EQ(q["total"].get<uint64_t>(), total);
    EXPECT_EQ(q["succeeded"].get<uint64_t>() + q["failed"].get<uint64_t>() +
                  q["rejected"].get<uint64_t>(),
              total);
    EXPECT_GT(q["succeeded"].get<uint64_t>(), 0u);
    EXPECT_EQ(r["bytes"]["mismatched"].get<uint64_t>(), 0u);
    EXPECT_GT(r["bytes"]["verified"].get<uint64_t>(), 0u);
    EXPECT_GE(r["bytes"]["transferred"].get<uint64_t>(), r["bytes"]["verified"].get<uint64_t>());
    EXPECT_GT(r["throughput_gb_per_s"].get<double>(), 0.0);
    const auto& lat = r["transfer_latency_ms"];
    EXPECT_LE(lat["p50"].get<double>(), lat["p90"].get<double>());
    EXPECT_LE(lat["p90"].get<double>(), lat["p99"].get<double>());
    EXPECT_LE(lat["p99"].get<double>(), lat["max"].get<double>());
    EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();
    EXPECT_EQ(r["rejected_requests"].size(), q["rejected"].get<size_t>());
    EXPECT_EQ(r["config"]["out"], out().string());

    const Logs logs = read_logs(out());
    EXPECT_TRUE(logs.bad.empty()) << logs.bad.size() << " bad log lines, first: " << logs.bad[0];
    for (const std::string f : {"router.jsonl", "prefill-tp0.jsonl", "decode-tp0.jsonl"}) {
      EXPECT_GT(logs.lines_by_file.count(f) ? logs.lines_by_file.at(f) : 0, 0u) << f;
    }
    for (const auto& f : r["faults"]) {
      const std::string room = f["room"].get<std::string>();
      EXPECT_EQ(f["observed_origin"], f["injected_at"]) << f.dump();
      EXPECT_EQ(f["applied"], true);
      const int counted =
          logs.above_debug_by_room.count(room) ? logs.above_debug_by_room.at(room) : 0;
      EXPECT_EQ(counted, 1) << "room " << room << " has " << counted << " lines above debug";
      EXPECT_EQ(f["lines_above_debug"].get<int>(), counted);
      EXPECT_GT(f["ranks_failed"].get<int>(), 0);
      EXPECT_FALSE(f["reason"].get<std::string>().empty());
    }
    // Every failed request here is a fault's room.
    EXPECT_EQ(r["faults"].size(), q["failed"].get<size_t>());
    expect_no_leaks(r);  // nothing left behind in the engines
  }
};

TEST_F(Replay, ShmTwoByTwoWithFaults) {
  const CliRun run = replay({"--trace", kAzure, "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                          "--decode-tp", "2", "--max-requests", "40", "--pool-mib", "256",
                          "--prefill-pool-mib", "64", "--page-size", "16", "--fault-rate", "0.2",
                          "--seed", "3", "--transport", "shm"});
  expect_clean(run, 40);
  const json r = report();
  EXPECT_GT(r["faults"].size() + r["faults_not_applied"].size(), 0u);
  EXPECT_GT(r["faults"].size(), 0u);
  EXPECT_EQ(r["config"]["transport"], "shm");
  EXPECT_EQ(read_logs(out()).lines_by_file.count("decode-tp1.jsonl"), 1u);
}

TEST_F(Replay, TcpOneByOneWithFaults) {
  const CliRun run = replay({"--trace", kAzure, "--model", "Qwen2.5-7B", "--prefill-tp", "1",
                          "--decode-tp", "1", "--max-requests", "15", "--pool-mib", "512",
                          "--prefill-pool-mib", "64", "--page-size", "16", "--fault-rate", "0.2",
                          "--seed", "5", "--transport", "tcp"});
  expect_clean(run, 15);
  EXPECT_EQ(report()["config"]["transport"], "tcp");
}

// Every rank with several transfer worker shards (rooms spread over them); bytes verified by the
// replay, faults attributed as without shards.
TEST_F(Replay, ShmTwoByTwoWithTwoTransferShards) {
  const CliRun run = replay({"--trace", kAzure, "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                          "--decode-tp", "2", "--max-requests", "30", "--pool-mib", "256",
                          "--prefill-pool-mib", "64", "--page-size", "16", "--fault-rate", "0.2",
                          "--seed", "7", "--transport", "shm", "--transfer-shards", "2"});
  expect_clean(run, 30);
  EXPECT_EQ(report()["config"]["transfer_shards"], 2);
}

TEST_F(Replay, TcpOneByTwoWithThreeTransferShards) {
  const CliRun run = replay({"--trace", kAzure, "--model", "Qwen2.5-7B", "--prefill-tp", "1",
                          "--decode-tp", "2", "--max-requests", "15", "--pool-mib", "256",
                          "--prefill-pool-mib", "64", "--page-size", "16", "--fault-rate", "0.2",
                          "--seed", "9", "--transport", "tcp", "--transfer-shards", "3"});
  expect_clean(run, 15);
  EXPECT_EQ(report()["config"]["transfer_shards"], 3);
}

// The prefill compute model, layer-wise, with unequal TP (prefill 2 -> decode 1: head slices),
// chunked sends and faults: every byte verified, faults attributed as without it, and every
// succeeded request's transfer tail in the report, none before its last layer's compute ended.
TEST_F(Replay, LayerwiseComputeModelTwoByOneChunkedWithFaults) {
  const CliRun run = replay({"--trace", kAzure, "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                          "--decode-tp", "1", "--max-requests", "20", "--pool-mib", "512",
                          "--prefill-pool-mib", "64", "--page-size", "16", "--chunk-tokens", "1024",
                          "--fault-rate", "0.2", "--seed", "11", "--transport", "shm",
                          "--prefill-ms-per-layer", "0.2", "--layerwise"});
  expect_clean(run, 20);
  const json r = report();
  EXPECT_EQ(r["config"]["prefill_ms_per_layer"].get<double>(), 0.2);
  EXPECT_TRUE(r["config"]["layerwise"].get<bool>());
  const uint64_t succeeded = r["requests"]["succeeded"].get<uint64_t>();
  EXPECT_EQ(r["transfer_tail_ms"]["count"].get<uint64_t>(), succeeded);
  ASSERT_EQ(r["transfer_tails"].size(), succeeded);
  for (const auto& t : r["transfer_tails"]) EXPECT_GE(t["ms"].get<double>(), 0.0) << t.dump();
  EXPECT_NE(run.output.find("transfer tail (last layer's compute -> decode Success)"), std::string::npos)
      << run.output;
}

TEST_F(Replay, RequestLargerThanTheDecodePoolIsRejected) {
  // Qwen2.5-7B at TP 1: 56 KiB of KV per token; a 32 MiB pool holds 585 tokens.
  const fs::path trace = dir_ / "trace.jsonl";
  {
    std::ofstream t(trace);
    for (int i = 0; i < 6; ++i) {
      const int tokens = i == 2 ? 50000 : 200 + i;
      t << "{\"timestamp\": " << i << ", \"input_length\": " << tokens
        << ", \"output_length\": 3, \"hash_ids\": [" << i << "]}\n";
    }
  }
  const CliRun run = replay({"--trace", trace.string(), "--model", "Qwen2.5-7B", "--pool-mib", "32",
                          "--prefill-pool-mib", "64", "--page-size", "16", "--transport", "shm"});
  expect_clean(run, 6);
  const json r = report();
  EXPECT_EQ(r["requests"]["rejected"], 1);
  EXPECT_EQ(r["requests"]["succeeded"], 5);
  EXPECT_EQ(r["requests"]["failed"], 0);
  ASSERT_EQ(r["rejected_requests"].size(), 1u);
  EXPECT_EQ(r["rejected_requests"][0]["input_tokens"], 50000);
  const std::string reason = r["rejected_requests"][0]["reason"];
  EXPECT_NE(reason.find("pool"), std::string::npos) << reason;
  EXPECT_NE(reason.find("50000"), std::string::npos) << reason;
}

TEST_F(Replay, MalformedTraceNamesTheLine) {
  const fs::path trace = dir_ / "bad.jsonl";
  {
    std::ofstream t(trace);
    t << "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [1]}\n"
      << "{\"timestamp\": 5, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [2]}\n"
      << "{\"timestamp\": 9, \"input_length\": \"many\", \"output_length\": 1}\n";
  }
  const CliRun run = replay({"--trace", trace.string()});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("line 3"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("bad.jsonl"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(out() / "logs"));  // nothing was started
}

TEST_F(Replay, UnknownModelListsTheKnownOnes) {
  const CliRun run = replay({"--trace", kAzure, "--max-requests", "3", "--model", "Llama-9-1T"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("Llama-9-1T"), std::string::npos) << run.output;
  for (const char* known : {"Llama-3.1-8B", "Llama-3.1-70B", "Qwen2.5-7B"}) {
    EXPECT_NE(run.output.find(known), std::string::npos) << known << " not in: " << run.output;
  }
}

TEST_F(Replay, InvalidPageSizeIsRefusedUpFront) {
  const CliRun run = replay({"--trace", kAzure, "--max-requests", "3", "--page-size", "0"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("--page-size"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(out() / "logs"));
}

TEST_F(Replay, RankThatCannotStartStopsTheReplay) {
  // The hidden test hook starts decode/tp1 with --page-size 0: a real rank that fails at start.
  const CliRun run = replay({"--trace", kAzure, "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                          "--decode-tp", "2", "--max-requests", "10", "--pool-mib", "128",
                          "--prefill-pool-mib", "64", "--page-size", "16",
                          "--test-break-rank", "decode/tp1"});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("decode/tp1"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("before the replay finished"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("page_size must be at least 1 token"), std::string::npos) << run.output;  // its stderr tail
  EXPECT_TRUE(processes_mentioning(dir_.string()).empty());
  const json r = report();
  EXPECT_EQ(r["status"], "failed");
  EXPECT_NE(r["error"].get<std::string>().find("decode/tp1"), std::string::npos);
}

// Waits until both engines told the router they are ready (the router logs it).
bool wait_engines_ready(const fs::path& out, pid_t orchestrator, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string log = slurp(out / "logs" / "router.jsonl");
    size_t n = 0;
    for (size_t p = log.find("engine ready"); p != std::string::npos;
         p = log.find("engine ready", p + 1)) {
      ++n;
    }
    if (n >= 2) return true;
    if (waitpid(orchestrator, nullptr, WNOHANG) != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Pid of the process whose command line mentions both strings (0: none).
pid_t find_process(const std::string& a, const std::string& b) {
  for (const auto& p : processes_mentioning(a)) {
    if (p.find(b) != std::string::npos) return std::stoi(p.substr(0, p.find(':')));
  }
  return 0;
}

std::vector<std::string> long_replay_args(const fs::path& out) {
  return {"replay", "--trace", kConversation, "--model", "Llama-3.1-8B", "--prefill-tp", "2",
          "--decode-tp", "2", "--max-requests", "60", "--pool-mib", "1024",
          "--prefill-pool-mib", "256", "--time-scale", "1", "--out", out.string()};
}

TEST_F(Replay, RankKilledMidRunStopsTheReplay) {
  const pid_t pid = start_cli(long_replay_args(out()), dir_ / "output.txt");
  ASSERT_TRUE(wait_engines_ready(out(), pid, 45)) << slurp(dir_ / "output.txt");
  const pid_t victim = find_process(dir_.string(), "decode-tp1.jsonl");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const int rc = wait_cli(pid);
  const std::string output = slurp(dir_ / "output.txt");
  EXPECT_EQ(rc, 1) << output;
  EXPECT_NE(output.find("decode/tp1 (pid " + std::to_string(victim) + ") was killed by signal 9"),
            std::string::npos)
      << output;
  EXPECT_TRUE(processes_mentioning(dir_.string()).empty());
  EXPECT_EQ(report()["status"], "failed");
}

TEST_F(Replay, SigtermStopsEveryProcess) {
  const pid_t pid = start_cli(long_replay_args(out()), dir_ / "output.txt");
  ASSERT_TRUE(wait_engines_ready(out(), pid, 45)) << slurp(dir_ / "output.txt");
  ASSERT_GT(find_process(dir_.string(), "prefill-tp0.jsonl"), 0);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int rc = wait_cli(pid);
  const std::string output = slurp(dir_ / "output.txt");
  EXPECT_EQ(rc, 128 + SIGTERM) << output;
  EXPECT_NE(output.find("stopped by signal 15"), std::string::npos) << output;
  EXPECT_TRUE(processes_mentioning(dir_.string()).empty());
  // A report of the requests that finished before the signal (docs/metrics.md, Ctrl-C).
  EXPECT_EQ(report()["status"], "partial");
  EXPECT_EQ(report()["partial"], true);
}

}  // namespace
}  // namespace kvferry_itest

namespace {
// These tests are about per-room faults, not peer death (peer_death_test.cc covers that with the
// default liveness deadlines). On a loaded 2-core machine a whole process can stall for more than a
// second, which the sub-second defaults would rightly call a death; give liveness more slack here.
class RelaxedLiveness : public ::testing::Environment {
 public:
  void SetUp() override {
    setenv("KVFERRY_HEARTBEAT_TIMEOUT_MS", "5000", 0);
    setenv("KVFERRY_ENGINE_TIMEOUT_MS", "5000", 0);
  }
};
const auto* const kRelaxedLiveness = ::testing::AddGlobalTestEnvironment(new RelaxedLiveness);
}  // namespace
