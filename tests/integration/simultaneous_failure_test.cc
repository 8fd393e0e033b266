// Several ranks fail the same room at once (issue 16, docs/failure-model.md): with a short waiting
// deadline, many requests in flight and small pools, the waiting deadlines of both decode ranks
// fire at nearly the same moment for many rooms, and each decode rank tells its own prefill
// source. Whatever order those failures reach the ranks in, every failed room must name ONE
// origin everywhere:
//   - both engines' results (results.json) name the same origin and code;
//   - the router's final error names that origin and no second one ("(prefill engine: ...)");
//   - exactly one log line above debug across all processes, by the origin rank;
//   - `kvferry logs --json` names the same origin; ranks whose own failure lost the root-cause
//     rule are listed as superseded (and logged it at debug with superseded_by), never as origins.
// Repeated with several seeds to hit the races.
#include <cstdio>
#include <map>
#include <set>

#include "replay_harness.h"

namespace kvferry_itest {
namespace {

class SimultaneousFailures : public ReplayDir, public ::testing::WithParamInterface<int> {};

TEST_P(SimultaneousFailures, DeadlinesOnEveryDecodeRankGiveOneOrigin) {
  const fs::path trace = write_trace(64, 0, {2048, 3072, 4096});
  const CliRun run = replay({"--trace", trace.string(), "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                             "--decode-tp", "2", "--pool-mib", "96", "--prefill-pool-mib", "48",
                             "--page-size", "16", "--max-inflight", "32", "--waiting-timeout-ms", "400",
                             "--seed", std::to_string(GetParam())});
  ASSERT_TRUE(fs::exists(out() / "results.json")) << run.output;
  const json results = this->results();
  const json r = report();
  EXPECT_EQ(r["faults_summary"]["misattributed"], 0) << r.dump(2);

  // The origin of every failed room, as both engines and the router's error name it.
  std::map<std::string, std::string> origin;
  size_t both_failed = 0;
  for (const json& q : results["requests"]) {
    const std::string room = q["room"];
    const json& p = q["prefill"];
    const json& d = q["decode"];
    const bool pf = p.is_object() && p["state"] == "Failed";
    const bool df = d.is_object() && d["state"] == "Failed";
    if (!pf && !df) continue;
    const json& main = df ? d : p;
    origin[room] = main["origin"];
    if (pf && df) {
      ++both_failed;
      EXPECT_EQ(p["origin"], d["origin"]) << "room " << room << ": two origins";
      EXPECT_EQ(p["code"], d["code"]) << "room " << room;
    }
    const std::string error = q["error"];
    EXPECT_NE(error.find(" at " + origin[room] + ": "), std::string::npos) << error;
    EXPECT_EQ(error.find("(prefill engine:"), std::string::npos) << error;
  }
  ASSERT_GT(origin.size(), 0u) << "no room failed: the deadline did not fire (" << run.output << ")";
  EXPECT_GT(both_failed, 0u);

  // Every process's log: one line above debug per failed room, by its origin; superseded lines.
  const LogLines logs = read_log_lines(out());
  EXPECT_TRUE(logs.bad.empty());
  std::map<std::string, std::vector<std::string>> above;  // room -> ranks logging above debug
  size_t superseded_lines = 0;
  for (const json& l : logs.lines) {
    if (!l.contains("room") || !origin.count(l["room"])) continue;
    const std::string room = l["room"];
    if (LogLines::above_debug(l)) above[room].push_back(l["rank"]);
    if (l.contains("superseded_by")) {
      ++superseded_lines;
      EXPECT_EQ(l["level"], "debug") << l.dump();
      EXPECT_EQ(l["superseded_by"], origin[room]) << l.dump();
      EXPECT_NE(l["rank"], origin[room]) << l.dump();
    }
    if (l.contains("is_from_another_rank")) {  // a release line: it names the room's one origin
      EXPECT_EQ(l["origin"], origin[room]) << l.dump();
      EXPECT_EQ(l["is_from_another_rank"] == "false", l["rank"] == origin[room]) << l.dump();
      EXPECT_TRUE(l.contains("reason")) << l.dump();
    }
  }
  for (const auto& [room, o] : origin) {
    const std::string want = o;
    if (want.rfind("prefill", 0) != 0 && want.rfind("decode", 0) != 0) continue;  // e.g. the router
    std::string lines_of_room;  // for the message: every line naming the room
    for (const json& l : logs.lines)
      if (l.contains("room") && l["room"] == room) lines_of_room += l.dump() + "\n";
    ASSERT_EQ(above[room].size(), 1u) << "room " << room << " (kept in " << dir_ << "):\n" << lines_of_room;
    EXPECT_EQ(above[room][0], want) << "room " << room;
  }
  // Whether both decode ranks' deadlines fired for one room before either heard of the other is
  // up to the scheduler (on a busy machine often not): the checks above hold either way, and the
  // count is printed. That a lost race is logged at debug with superseded_by is asserted where it
  // is certain, python/tests/test_simultaneous_failures.py (a rank is stopped while both fail).
  std::printf("rooms failed %zu, on both sides %zu, superseded lines %zu\n", origin.size(),
              both_failed, superseded_lines);

  // `kvferry logs --json` reads the fields and names the same one origin.
  const CliRun lr = run_cli({"logs", out().string(), "--json"}, dir_ / "logs.txt");
  ASSERT_EQ(lr.exit_code, 0) << lr.output;
  const size_t start = lr.output.find('[');
  ASSERT_NE(start, std::string::npos) << lr.output;
  const json rooms = json::parse(lr.output.substr(start));
  size_t seen = 0;
  for (const json& f : rooms) {
    auto it = origin.find(f["room"].get<std::string>());
    if (it == origin.end()) continue;
    ++seen;
    EXPECT_EQ(f["origin"], it->second) << f.dump();
    EXPECT_FALSE(f["reason"].get<std::string>().empty()) << f.dump();
    for (const json& s : f["superseded"]) EXPECT_NE(s, it->second) << f.dump();
  }
  EXPECT_EQ(seen, origin.size());
}

INSTANTIATE_TEST_SUITE_P(Seeds, SimultaneousFailures, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace kvferry_itest
