// Restarts on the same address and ports, in a 2+2 replay of real processes
// (`--faults restart@<rank>`): the orchestrator SIGKILLs the rank while rooms are in flight and
// starts it again 1.5 s later on the control, engine and metrics ports the killed process had
// bound. The rank is a new incarnation on the old endpoints (kvferry/messages.h): every peer
// finds it again (the bootstrap entry names the same endpoint with a new incarnation), the rooms
// of the old incarnation fail with the rank as origin, and every room dispatched once it is back
// succeeds. Checked from the report (docs/report.md, peer_deaths: same_ports,
// rooms_after_restart_failed, first_success_after_restart_ms, stale_refused) and the port files.
#include <fstream>

#include "replay_harness.h"

namespace kvferry_itest {
namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  return s;
}

// The sum of every rank's kvferry_stale_messages_total at exit (DIR/metrics/*.prom).
uint64_t stale_counters(const fs::path& dir) {
  uint64_t sum = 0;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".prom") continue;
    std::ifstream in(f.path());
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("kvferry_stale_messages_total{", 0) != 0) continue;
      sum += std::stoull(line.substr(line.rfind(' ') + 1));
    }
  }
  return sum;
}

class Restart : public ReplayDir, public ::testing::WithParamInterface<std::string> {};

TEST_P(Restart, SameAddressAndPortsFoundAgainByEveryPeer) {
  const std::string rank = GetParam();
  std::string file = rank;
  file[file.find('/')] = '-';
  // Two waves: the kill lands within the first 72 requests (30-60%); the last 30 come 4 s later,
  // once the rank is back (rooms dispatched after the restart).
  const fs::path trace = write_trace(120, 100, {100, 150, 200, 300}, 90, 4000);
  const CliRun run = replay({"--trace", trace.string(), "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                             "--decode-tp", "2", "--pool-mib", "256", "--prefill-pool-mib", "64", "--page-size",
                             "16", "--time-scale", "1", "--seed", "3", "--faults", "restart@" + rank,
                             "--engine-timeout-ms", "600", "--restart-delay-ms", "1500", "--metrics"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("peer death: restarted " + rank), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("on the same ports"), std::string::npos) << run.output;
  const json r = report();
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  ASSERT_EQ(r["peer_deaths"].size(), 1u);
  const json& d = r["peer_deaths"][0];
  EXPECT_EQ(d["rank"], rank);
  EXPECT_EQ(d["same_ports"], true);
  EXPECT_EQ(d["restarted"], true);
  EXPECT_EQ(d["rooms_misattributed"], 0) << d.dump();
  EXPECT_GE(d["rooms_after_restart"].get<uint64_t>(), 3u) << d.dump();
  EXPECT_EQ(d["rooms_after_restart_failed"], 0) << d.dump();
  EXPECT_GT(d["first_success_after_restart_ms"].get<double>(), 0.0) << d.dump();
  // Stale messages (meant for, or from, the old incarnation) are refused and counted: the lines
  // the report counts after the kill are the ranks' counters at exit (no refusal before it).
  EXPECT_EQ(d["stale_refused"].get<uint64_t>(), stale_counters(out() / "metrics")) << d.dump();
  RecordProperty("first_success_after_restart_ms", std::to_string(d["first_success_after_restart_ms"].get<double>()));
  EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();
  EXPECT_EQ(r["bytes"]["mismatched"], 0);
  // The same ports: the restarted process wrote the port files again with the same values.
  const fs::path logs = out() / "logs";
  EXPECT_FALSE(read_text(logs / (file + ".control.port")).empty());
  // Every failed room names the restarted rank.
  expect_failures_name(rank);
  expect_no_leaks(r);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Restart, ::testing::Values("prefill/tp1", "decode/tp1"),
                         rank_param_name);

}  // namespace
}  // namespace kvferry_itest
