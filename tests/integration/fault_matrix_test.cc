// The fault matrix: every injected failure source x side x rank position on a 1+1 and a 2+2
// cluster of real processes. Each case replays a few requests that all get the one fault (rate
// 1.0) and checks, for every failed room, from results.json, the report and every rank's log:
//   - every rank of both engines reached Failed (ranks_failed == prefill_tp + decode_tp), soon
//     after the failure was first observed; except for failures the decode side observes after
//     the prefill side finished its part (transfer@decode and corrupt always: the data arrived; abort when
//     it comes late): the prefill engine then reports Success, every decode rank Failed, and the
//     report says so (ranks_concluded, concluded_engines; docs/report.md "Which ranks reach Failed");
//   - both engines (that failed) report the injected origin and the kind's code;
//   - exactly one log line above debug across all processes, logged by the origin rank;
//   - is_from_another_rank is false on the origin only, on every rank's release line;
//   - the router's final error names the room, code and origin;
//   - no room, record or page left on any rank after the drain.
#include <cctype>
#include <map>
#include <ostream>
#include <set>

#include "replay_harness.h"

namespace kvferry_itest {
namespace {

struct Case {
  uint32_t tp;
  std::string kind;  // fault kind
  std::string at;    // the rank it acts on
  std::string code;  // expected code
  std::string name() const {
    std::string n = std::to_string(tp) + "x" + std::to_string(tp) + "_" + kind + "_" + at;
    for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return n;
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.kind << "@" << c.at << " on " << c.tp << "+" << c.tp; }

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (uint32_t tp : {1u, 2u}) {
    for (uint32_t r = 0; r < tp; ++r) {
      const std::string p = "prefill/tp" + std::to_string(r), d = "decode/tp" + std::to_string(r);
      cases.push_back({tp, "transfer", p, "transfer_error"});
      cases.push_back({tp, "transfer", d, "transfer_error"});
      cases.push_back({tp, "decode_fail", d, "injected"});
      cases.push_back({tp, "timeout", p, "bootstrap_timeout"});
      cases.push_back({tp, "timeout", d, "waiting_timeout"});
      cases.push_back({tp, "corrupt", d, "integrity_error"});  // a byte flipped in flight (--integrity)
    }
    cases.push_back({tp, "abort", "decode/tp0", "aborted"});  // always at the decode leader
  }
  return cases;
}

class FaultMatrix : public ReplayDir, public ::testing::WithParamInterface<Case> {};

TEST_P(FaultMatrix, EveryRankFailsWithTheInjectedOriginAndOneLine) {
  const Case& c = GetParam();
  const size_t kRequests = 6;
  // Rooms of 1500-2000 tokens (Qwen2.5-7B: 56 KiB per token) take long enough to transfer for
  // an abort 2-10 ms after the dispatch to find them in flight.
  const fs::path trace = write_trace(kRequests, 20, {1500, 1650, 1800, 2000});
  const std::string spec = c.kind == "abort" ? "abort:1" : c.kind + "@" + c.at + ":1";
  std::vector<std::string> args{"--trace", trace.string(), "--model", "Qwen2.5-7B", "--prefill-tp",
                                std::to_string(c.tp), "--decode-tp", std::to_string(c.tp),
                                "--pool-mib", "256", "--prefill-pool-mib", "64", "--page-size", "16",
                                "--faults", spec, "--fault-timeout-ms", "500", "--seed", "1"};
  if (c.kind == "corrupt") args.push_back("--integrity");  // what detects it
  const CliRun run = replay(args);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json r = report();
  const json res = results();
  // Decode-side failures that may come after the prefill engine finished the room (see top).
  const bool on_decode = c.at.rfind("decode", 0) == 0;
  // corrupt: decode's integrity check runs once every source said Success.
  const bool prefill_may_succeed = c.kind == "abort" || c.kind == "corrupt" || (c.kind == "transfer" && on_decode);
  std::map<std::string, bool> prefill_failed;  // room -> the prefill engine reported Failed
  for (const auto& q : res["requests"]) {
    prefill_failed[q["room"]] = q["prefill"].is_object() && q["prefill"]["state"] == "Failed";
  }

  // Every request got the fault; it acted on all of them (an abort may come after its room ended).
  EXPECT_EQ(r["faults"].size() + r["faults_not_applied"].size(), kRequests);
  if (c.kind == "abort") {
    EXPECT_GE(r["faults"].size(), 1u);
    for (const auto& f : r["faults_not_applied"]) EXPECT_EQ(f["outcome"], "succeeded") << f.dump();
  } else {
    EXPECT_EQ(r["faults"].size(), kRequests) << r["faults_not_applied"].dump();
  }
  EXPECT_EQ(r["requests"]["failed"].get<size_t>(), r["faults"].size());
  EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  EXPECT_EQ(r["bytes"]["mismatched"], 0);

  const LogLines logs = read_log_lines(out());
  EXPECT_TRUE(logs.bad.empty()) << logs.bad.front();
  std::set<std::string> failed_rooms;
  for (const auto& f : r["faults"]) {
    const std::string room = f["room"];
    failed_rooms.insert(room);
    if (!prefill_may_succeed) {
      EXPECT_TRUE(prefill_failed[room]) << room;
    }
    const uint32_t all_ranks = c.tp + (prefill_failed[room] ? c.tp : 0);
    EXPECT_EQ(f["injected_at"], c.at) << f.dump();
    EXPECT_EQ(f["observed_origin"], c.at) << f.dump();
    EXPECT_EQ(f["code"], c.code) << f.dump();
    EXPECT_EQ(f["ranks_failed"], all_ranks) << f.dump();
    // Every rank is accounted for: Failed, or its engine concluded the room before the failure.
    EXPECT_EQ(f["ranks_total"], 2 * c.tp) << f.dump();
    EXPECT_EQ(f["ranks_concluded"], prefill_failed[room] ? 0 : c.tp) << f.dump();
    EXPECT_EQ(f["concluded_engines"], prefill_failed[room] ? json::array() : json::array({"prefill"})) << f.dump();
    EXPECT_LT(f["time_to_all_failed_ms"].get<double>(), 2000) << f.dump();
    EXPECT_EQ(f["lines_above_debug"], 1) << f.dump();
    const std::string error = f["error"];
    EXPECT_EQ(error.rfind("room " + room + " failed: " + c.code + " at " + c.at + ": ", 0), 0u) << error;

    // Logs, counted here: one line above debug, by the origin; release lines on every rank.
    std::vector<json> above;
    std::map<std::string, std::string> from_another;  // rank -> is_from_another_rank
    for (const auto& l : logs.lines) {
      if (l.value("room", "") != room) continue;
      if (LogLines::above_debug(l)) above.push_back(l);
      if (l.contains("is_from_another_rank")) from_another[l["rank"]] = l["is_from_another_rank"];
    }
    ASSERT_EQ(above.size(), 1u) << "room " << room;
    EXPECT_EQ(above[0]["rank"], c.at) << above[0].dump();
    EXPECT_EQ(above[0]["origin"], c.at) << above[0].dump();
    EXPECT_EQ(above[0]["code"], c.code) << above[0].dump();
    const std::string level = c.kind == "abort" ? "info" : (on_decode ? "error" : "warning");
    EXPECT_EQ(above[0]["level"], level) << above[0].dump();
    EXPECT_EQ(from_another.size(), all_ranks) << "room " << room;
    for (const auto& [rank, another] : from_another) {
      EXPECT_EQ(another, rank == c.at ? "false" : "true") << rank << " room " << room;
    }
  }
  // Both engines' own verdicts carry the injected origin and code.
  size_t checked = 0;
  for (const auto& q : res["requests"]) {
    if (!failed_rooms.count(q["room"].get<std::string>())) continue;
    for (const char* engine : {"prefill", "decode"}) {
      const json& e = q[engine];
      ASSERT_TRUE(e.is_object()) << q.dump();
      if (engine == std::string("prefill") && prefill_may_succeed && e["state"] == "Success") {
        EXPECT_GT(e["bytes_transferred"].get<uint64_t>(), 0u) << q.dump();  // it did its part
        continue;
      }
      EXPECT_EQ(e["state"], "Failed") << engine << " " << q.dump();
      EXPECT_EQ(e["origin"], c.at) << engine << " " << q.dump();
      EXPECT_EQ(e["code"], c.code) << engine << " " << q.dump();
      EXPECT_EQ(e["ranks_failed"], c.tp) << engine << " " << q.dump();
      EXPECT_GE(e["failed_all_ns"].get<int64_t>(), e["first_failed_ns"].get<int64_t>());
    }
    EXPECT_NE(q["error"].get<std::string>().find(" at " + c.at + ": "), std::string::npos) << q.dump();
    ++checked;
  }
  EXPECT_EQ(checked, failed_rooms.size());
  expect_no_leaks(r);
}

INSTANTIATE_TEST_SUITE_P(Sources, FaultMatrix, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

// The plan's rates mixed, as `make faults` runs them (smaller): every kind appears, each
// applied fault is attributed with its code and one line, and nothing else fails.
TEST_F(ReplayDir, MixedPlanOnTwoByTwo) {
  const fs::path trace = write_trace(60, 5, {300, 900, 1500, 2200});
  const CliRun run = replay({"--trace", trace.string(), "--model", "Qwen2.5-7B", "--prefill-tp",
                             "2", "--decode-tp", "2", "--pool-mib", "256", "--prefill-pool-mib",
                             "64", "--page-size", "16", "--seed", "4", "--fault-timeout-ms", "500",
                             "--faults",
                             "transfer@prefill:0.1,transfer@decode:0.1,decode_fail:0.1,"
                             "timeout@prefill:0.1,timeout@decode:0.1,abort:0.1"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json r = report();
  const json& kinds = r["faults_summary"]["by_kind"];
  for (const char* k : {"transfer@prefill", "transfer@decode", "decode_fail@decode",
                        "timeout@prefill", "timeout@decode", "abort@decode"}) {
    ASSERT_TRUE(kinds.contains(k)) << k << " " << kinds.dump();
    EXPECT_EQ(kinds[k]["attributed"], kinds[k]["applied"]) << k;
    EXPECT_EQ(kinds[k]["exactly_one_line"], kinds[k]["applied"]) << k;
  }
  EXPECT_EQ(r["faults_summary"]["misattributed"], 0);
  EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();
  EXPECT_EQ(r["bytes"]["mismatched"], 0);
  EXPECT_GT(r["requests"]["succeeded"], 0);
  expect_no_leaks(r);
  // Every prefill rank lived: nothing is left quarantined on a decode rank (docs/report.md).
  for (const auto& s : r["leaks"]["decode"]) {
    EXPECT_EQ(s["quarantined_pages"], 0) << s.dump();
    EXPECT_TRUE(s["reclaimed_pages"].is_number_unsigned()) << s.dump();
  }
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
