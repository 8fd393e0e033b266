// `kvferry replay --prefill-dp N --decode-dp M`: every DP group is its own engine (a leader and
// its followers); the router sends each room to the group of each engine that serves it
// (kvferry/routing.h). Checked from the outside: report.json, results.json and every rank's log:
//   - every byte verified, nothing mismatched, nothing rejected, no unexpected failure;
//   - every rank of every DP group ran and logged (file names carry the group when it is not 0),
//     and every log line about a room comes from a rank of the group that serves it;
//   - faults on both sides (a writing prefill rank, a decode rank, and prefill_fail) fail their
//     room with the injected origin, named in the room's DP group, with the kind's code;
//   - both DP groups of the DP engine served rooms; leaks listed for dp x tp ranks, all zero.
#include <map>
#include <ostream>
#include <set>

#include "kvferry/error.h"
#include "kvferry/routing.h"
#include "replay_harness.h"

namespace kvferry_itest {
namespace {

struct Case {
  std::string name;
  uint32_t prefill_tp, prefill_dp, decode_tp, decode_dp;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class DataParallel : public ReplayDir, public ::testing::WithParamInterface<Case> {};

TEST_P(DataParallel, RoomsGoToTheirGroupAndFaultsAreAttributedThere) {
  const Case& c = GetParam();
  const size_t kRequests = 8;
  const fs::path trace = write_trace(kRequests, 5, {600, 1500, 900, 1200});
  const std::string faults =
      "transfer@prefill/tp0:once,decode_fail@decode:once,prefill_fail@prefill:once";
  const CliRun run = replay({"--trace", trace.string(), "--model", "Llama-3.1-8B",
                             "--prefill-tp", std::to_string(c.prefill_tp), "--prefill-dp",
                             std::to_string(c.prefill_dp), "--decode-tp",
                             std::to_string(c.decode_tp), "--decode-dp",
                             std::to_string(c.decode_dp), "--page-size", "16", "--pool-mib", "384",
                             "--prefill-pool-mib", "64", "--faults", faults, "--seed", "5"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json r = report();
  ASSERT_EQ(r["status"], "ok") << r["error"];
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  EXPECT_EQ(r["config"]["prefill_dp"], c.prefill_dp);
  EXPECT_EQ(r["config"]["decode_dp"], c.decode_dp);
  const auto& q = r["requests"];
  EXPECT_EQ(q["total"], kRequests);
  EXPECT_EQ(q["rejected"], 0);
  EXPECT_EQ(q["succeeded"].get<uint64_t>() + q["failed"].get<uint64_t>(), kRequests);
  EXPECT_GT(q["succeeded"].get<uint64_t>(), 0u);
  EXPECT_EQ(r["bytes"]["mismatched"], 0);
  EXPECT_GT(r["bytes"]["verified"].get<uint64_t>(), 0u);
  EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();

  auto dp_of = [&](kvferry::Role role) { return role == kvferry::Role::kPrefill ? c.prefill_dp : c.decode_dp; };
  // Faults: on both sides, attributed to the injected rank, which is in the room's group.
  std::set<std::string> kinds;
  for (const auto& f : r["faults"]) {
    const std::string at = f["injected_at"];
    const uint64_t room = std::stoull(f["room"].get<std::string>());
    EXPECT_EQ(f["observed_origin"], at) << f.dump();
    EXPECT_EQ(f["code"], f["kind"] == "transfer" ? "transfer_error" : "injected") << f.dump();
    EXPECT_EQ(f["lines_above_debug"], 1) << f.dump();
    const auto rank = kvferry::RankId::parse(at);
    ASSERT_TRUE(rank.has_value()) << at;
    EXPECT_EQ(rank->dp_rank, kvferry::dp_rank_for_room(room, dp_of(rank->role))) << f.dump();
    // Every rank of the two groups that had the room failed it.
    EXPECT_EQ(f["ranks_failed"], c.prefill_tp + c.decode_tp) << f.dump();
    kinds.insert(f["kind"].get<std::string>());
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"transfer", "decode_fail", "prefill_fail"}));
  EXPECT_TRUE(r["faults_not_applied"].empty()) << r["faults_not_applied"].dump();
  EXPECT_EQ(r["faults"].size(), q["failed"].get<size_t>()) << "every failed request is a fault's room";

  // Rooms spread over the groups; every log line about a room is from a rank of its group.
  std::set<std::string> groups_used;
  const json res = results();
  for (const auto& rq : res["requests"]) {
    const uint64_t room = std::stoull(rq["room"].get<std::string>());
    groups_used.insert("prefill" + std::to_string(kvferry::dp_rank_for_room(room, c.prefill_dp)));
    groups_used.insert("decode" + std::to_string(kvferry::dp_rank_for_room(room, c.decode_dp)));
  }
  EXPECT_EQ(groups_used.size(), size_t(c.prefill_dp + c.decode_dp)) << "the seed leaves a group idle";
  const LogLines logs = read_log_lines(out());
  EXPECT_TRUE(logs.bad.empty());
  std::map<std::string, size_t> lines_by_rank;
  size_t room_lines = 0;
  for (const auto& l : logs.lines) {
    const auto rank = kvferry::RankId::parse(l.value("rank", ""));
    if (!rank) continue;  // bootstrap, router
    ++lines_by_rank[rank->str()];
    if (!l.contains("room")) continue;
    const uint64_t room = std::stoull(l["room"].get<std::string>());
    EXPECT_EQ(rank->dp_rank, kvferry::dp_rank_for_room(room, dp_of(rank->role))) << l.dump();
    ++room_lines;
  }
  EXPECT_GT(room_lines, 0u);
  // Every rank of every group ran, logged, reported its stats and left nothing behind.
  for (bool prefill : {true, false}) {
    const uint32_t tp = prefill ? c.prefill_tp : c.decode_tp, dp = prefill ? c.prefill_dp : c.decode_dp;
    const char* engine = prefill ? "prefill" : "decode";
    std::set<std::string> want, leak_ranks;
    for (uint32_t g = 0; g < dp; ++g) {
      for (uint32_t t = 0; t < tp; ++t) {
        const kvferry::RankId id{prefill ? kvferry::Role::kPrefill : kvferry::Role::kDecode, 0, t, g};
        want.insert(id.str());
        EXPECT_GT(lines_by_rank[id.str()], 0u) << id.str();
        std::string file = id.str();
        std::replace(file.begin(), file.end(), '/', '-');
        EXPECT_TRUE(fs::exists(out() / "logs" / (file + ".jsonl"))) << file;
      }
    }
    ASSERT_TRUE(r["leaks"][engine].is_array()) << engine;
    for (const auto& s : r["leaks"][engine]) leak_ranks.insert(s["rank"].get<std::string>());
    EXPECT_EQ(leak_ranks, want) << engine;
  }
  expect_no_leaks(r);
}

INSTANTIATE_TEST_SUITE_P(
    Replay, DataParallel,
    ::testing::Values(Case{"Prefill1x2_Decode2x2", 1, 2, 2, 2}, Case{"Prefill2x1_Decode1x2", 2, 1, 1, 2}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvferry_itest
