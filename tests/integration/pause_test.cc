// A rank stopped, not killed (`--faults pause@<rank>:MS`), in a 2+2 tcp replay of real
// processes: the orchestrator sends the rank SIGSTOP while rooms are in flight and SIGCONT MS ms
// later. Its sockets stay open, so it is alive but silent: a false death, as a host starving a
// rank or a paused VM makes one. MS is past every patience (heartbeats: 4 x 800 ms for a peer whose
// socket accepts; the engine agreement: 4 x 600 ms), so its peers declare it dead and its rooms
// fail with it as origin. What must hold (docs/failure-model.md "A silent peer is only presumed
// dead", docs/testing.md "A rank stalled past every patience comes back at once"):
//   - every byte of every room that succeeded is right: the stopped rank's writes, which resume
//     when it runs again, never land in pages given to another room (the false death once
//     produced rooms that reported Success with megabytes of wrong bytes);
//   - one peer_dead line above debug per detecting engine, no line from the stopped rank blaming
//     a live peer; failures name the stopped rank;
//   - it comes back without a restart, and rooms dispatched after it is back succeed;
//   - nothing leaks, nothing stays quarantined.
// Checked from the report (docs/report.md "Network faults": pause entries) and results.json.
#include "replay_harness.h"

namespace kvferry_itest {
namespace {

class Pause : public ReplayDir, public ::testing::WithParamInterface<std::string> {};

TEST_P(Pause, StoppedRankIsAFalseDeathThatCorruptsNothingAndComesBack) {
  const std::string rank = GetParam();
  // Two waves: the pause lands within the first 72 requests (30-60%); the last 30 come 12 s
  // later, once the rank runs again and is back (rooms dispatched after the heal).
  const fs::path trace = write_trace(120, 100, {100, 150, 200, 300, 1200}, 90, 12000);
  const CliRun run = replay({"--trace", trace.string(), "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                             "--decode-tp", "2", "--pool-mib", "256", "--prefill-pool-mib", "64", "--page-size",
                             "16", "--time-scale", "1", "--seed", "5", "--transport", "tcp", "--faults",
                             "pause@" + rank + ":5000", "--engine-timeout-ms", "600"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("replay: pause: " + rank), std::string::npos) << run.output;
  const json r = report();
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  EXPECT_EQ(r["bytes"]["mismatched"], 0);
  EXPECT_GT(r["bytes"]["verified"].get<uint64_t>(), 0u);
  ASSERT_EQ(r["net_faults"].size(), 1u);
  const json& f = r["net_faults"][0];
  EXPECT_EQ(f["kind"], "pause");
  EXPECT_EQ(f["host"], rank);
  EXPECT_EQ(f["error"], "") << f.dump();
  EXPECT_EQ(f["beyond_heartbeat_timeout"], true);
  EXPECT_EQ(f["rooms_misattributed"], 0) << f.dump();
  EXPECT_TRUE(f["repeated_detections"].empty()) << f.dump();
  EXPECT_TRUE(f["same_side_lines"].empty()) << f.dump();
  EXPECT_TRUE(f["undetected"].empty()) << f.dump();
  EXPECT_GE(f["rooms_after_heal"].get<uint64_t>(), 20u) << f.dump();
  EXPECT_EQ(f["rooms_after_heal_failed"], 0) << f.dump();
  EXPECT_GT(f["first_success_after_heal_ms"].get<double>(), 0.0) << f.dump();
  RecordProperty("first_success_after_heal_ms", std::to_string(f["first_success_after_heal_ms"].get<double>()));
  EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();
  EXPECT_TRUE(r["unexplained_peer_dead"].empty()) << r["unexplained_peer_dead"].dump();
  // Every failed room names the stopped rank, with the code of a dead peer.
  expect_failures_name(rank);
  expect_no_leaks(r);
  for (const auto& s : r["leaks"]["decode"]) EXPECT_EQ(s["quarantined_pages"], 0) << s.dump();
}

INSTANTIATE_TEST_SUITE_P(Ranks, Pause, ::testing::Values("prefill/tp1", "decode/tp1"),
                         rank_param_name);

}  // namespace
}  // namespace kvferry_itest
