// `kvferry replay --prefill-instances 2 --decode-instances 2` (xPyD): every instance its own
// engine, every prefill instance its own bootstrap service; the router picks a prefill and a
// decode instance per request. Checked from the outside: report.json, results.json and every
// rank's log:
//   - every byte verified, nothing mismatched, no unexpected failure;
//   - every instance ran (its files carry the instance: prefill1-tp0, decode1-tp0, bootstrap1)
//     and every (prefill, decode) pair of instances served rooms: a decode rank serves rooms of
//     every prefill instance;
//   - every log line about a room comes from a rank of an instance the room was sent to;
//   - faults on both sides fail their room with the injected origin, named in the room's
//     instance (a decode origin is its rank's own engine id; a prefill one the room's prefill
//     instance, report.h instance_origin()), with the kind's code;
//   - report.json's per-instance figures add up to the totals; leaks listed per instance, all zero.
#include <map>
#include <set>

#include "kvferry/error.h"
#include "replay_harness.h"

namespace kvferry_itest {
namespace {

class Xpyd : public ReplayDir {};

TEST_F(Xpyd, RoomsSpreadOverEveryInstancePairAndFaultsKeepTheirOrigin) {
  const size_t kRequests = 32;
  const fs::path trace = write_trace(kRequests, 5, {600, 1500, 900, 1200});
  const std::string faults = "transfer@prefill:0.1,decode_fail@decode:0.1,transfer@decode:0.05";
  const CliRun run = replay({"--trace", trace.string(), "--model", "Llama-3.1-8B", "--prefill-instances", "2",
                             "--decode-instances", "2", "--page-size", "16", "--pool-mib", "256",
                             "--prefill-pool-mib", "64", "--max-inflight", "8", "--transport", "tcp",
                             "--faults", faults, "--seed", "7"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json r = report();
  ASSERT_EQ(r["status"], "ok") << r["error"];
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  EXPECT_EQ(r["config"]["prefill_instances"], 2);
  EXPECT_EQ(r["config"]["decode_instances"], 2);
  const auto& q = r["requests"];
  EXPECT_EQ(q["total"], kRequests);
  EXPECT_EQ(q["rejected"], 0);
  EXPECT_GT(q["succeeded"].get<uint64_t>(), 0u);
  EXPECT_EQ(r["bytes"]["mismatched"], 0);
  EXPECT_GT(r["bytes"]["verified"].get<uint64_t>(), 0u);
  EXPECT_TRUE(r["unexpected_failures"].empty()) << r["unexpected_failures"].dump();
  EXPECT_NE(run.output.find("decode instance 1: "), std::string::npos) << run.output;

  // The instances of every room, as the router chose them (absent: instance 0).
  std::map<std::string, std::pair<uint32_t, uint32_t>> inst;
  std::set<std::pair<uint32_t, uint32_t>> pairs;
  const json res = results();
  for (const auto& rq : res["requests"]) {
    const std::pair<uint32_t, uint32_t> pd{rq.value("prefill_instance", 0u), rq.value("decode_instance", 0u)};
    inst[rq["room"].get<std::string>()] = pd;
    pairs.insert(pd);
  }
  EXPECT_EQ(pairs.size(), 4u) << "every decode instance served rooms of every prefill instance";

  // Faults on both sides, attributed to the injected rank, named in the room's instance.
  std::set<std::string> roles;
  for (const auto& f : r["faults"]) {
    const std::string at = f["injected_at"];
    EXPECT_EQ(f["observed_origin"], at) << f.dump();
    EXPECT_EQ(f["code"], f["kind"] == "transfer" ? "transfer_error" : "injected") << f.dump();
    EXPECT_EQ(f["lines_above_debug"], 1) << f.dump();
    const auto rank = kvferry::RankId::parse(at);
    ASSERT_TRUE(rank.has_value()) << at;
    const auto [p, d] = inst.at(f["room"].get<std::string>());
    EXPECT_EQ(rank->engine_id, rank->role == kvferry::Role::kPrefill ? p : d) << f.dump();
    roles.insert(std::string(kvferry::role_name(rank->role)));
  }
  EXPECT_EQ(roles, (std::set<std::string>{"prefill", "decode"}));
  EXPECT_TRUE(r["faults_not_applied"].empty()) << r["faults_not_applied"].dump();
  EXPECT_EQ(r["faults"].size(), q["failed"].get<size_t>()) << "every failed request is a fault's room";

  // Every rank's log: its file names its instance, and its room lines are of rooms sent there.
  std::map<std::string, size_t> room_lines;
  for (const char* file : {"prefill-tp0", "prefill1-tp0", "decode-tp0", "decode1-tp0"}) {
    const std::string name(file);
    const bool prefill = name.rfind("prefill", 0) == 0;
    const uint32_t want = name.find("1-") != std::string::npos ? 1 : 0;
    std::ifstream in(out() / "logs" / (name + ".jsonl"));
    ASSERT_TRUE(in) << name;
    for (std::string line; std::getline(in, line);) {
      const json l = json::parse(line, nullptr, false);
      ASSERT_FALSE(l.is_discarded()) << name << ": " << line;
      if (!l.contains("room")) continue;
      const auto it = inst.find(l["room"].get<std::string>());
      ASSERT_NE(it, inst.end()) << line;
      EXPECT_EQ(prefill ? it->second.first : it->second.second, want) << name << ": " << line;
      ++room_lines[name];
    }
    EXPECT_GT(room_lines[name], 0u) << name;
  }
  EXPECT_TRUE(fs::exists(out() / "logs" / "bootstrap1.jsonl"));

  // Per-instance figures: every instance listed, the rooms and bytes add up to the totals.
  ASSERT_EQ(r["instances"].size(), 4u) << r["instances"].dump();
  uint64_t rooms[2] = {0, 0}, ok[2] = {0, 0}, verified = 0, transferred = 0;
  for (const auto& f : r["instances"]) {
    const size_t k = f["role"] == "prefill" ? 0 : 1;
    EXPECT_GT(f["rooms"].get<uint64_t>(), 0u) << f.dump();
    rooms[k] += f["rooms"].get<uint64_t>();
    ok[k] += f["succeeded"].get<uint64_t>();
    if (k == 0) transferred += f["bytes_transferred"].get<uint64_t>();
    if (k == 1) verified += f["bytes_verified"].get<uint64_t>();
    EXPECT_EQ(f["faults"], f["faults_attributed"]) << f.dump();
  }
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(rooms[k], kRequests);
    EXPECT_EQ(ok[k], q["succeeded"].get<uint64_t>());
  }
  EXPECT_EQ(transferred, r["bytes"]["transferred"].get<uint64_t>());
  EXPECT_EQ(verified, r["bytes"]["verified"].get<uint64_t>());
  std::set<std::string> leak_ranks;
  for (const char* engine : {"prefill", "decode"})
    for (const auto& s : r["leaks"][engine]) leak_ranks.insert(s["rank"].get<std::string>());
  EXPECT_EQ(leak_ranks, (std::set<std::string>{"prefill/tp0", "prefill1/tp0", "decode/tp0", "decode1/tp0"}));
  expect_no_leaks(r);
}

// Faults toward a decode rank of any instance (issue 34's attack on xPyD, finding 3): a prefill
// rank places `corrupt` (a flipped byte toward that destination) and `timeout@decode` (it stays
// silent toward it) once the room's metadata named its decode instance. Before, it placed them at
// sender() time, when only engine 0's ranks are known: every such fault aimed at decode instance 1
// was "not applied" and the run still said 100 % attributed.
TEST_F(Xpyd, FaultsTowardEveryDecodeInstanceAreApplied) {
  const size_t kRequests = 40;
  const fs::path trace = write_trace(kRequests, 5, {400, 700});
  const CliRun run = replay({"--trace", trace.string(), "--model", "Llama-3.1-8B", "--prefill-instances", "2",
                             "--decode-instances", "2", "--page-size", "16", "--pool-mib", "256",
                             "--prefill-pool-mib", "64", "--max-inflight", "8", "--integrity", "--faults",
                             "corrupt@decode:0.2,timeout@decode:0.15", "--fault-timeout-ms", "1000", "--seed", "5"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json r = report();
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  EXPECT_TRUE(r["faults_not_applied"].empty()) << r["faults_not_applied"].dump();
  std::set<std::pair<std::string, uint32_t>> kinds_by_instance;
  for (const auto& f : r["faults"]) {
    EXPECT_EQ(f["observed_origin"], f["injected_at"]) << f.dump();
    const auto rank = kvferry::RankId::parse(f["injected_at"].get<std::string>());
    ASSERT_TRUE(rank.has_value()) << f.dump();
    kinds_by_instance.insert({f["kind"].get<std::string>(), rank->engine_id});
  }
  for (const char* kind : {"corrupt", "timeout"})
    for (uint32_t d : {0u, 1u})
      EXPECT_TRUE(kinds_by_instance.count({kind, d})) << kind << " at decode instance " << d << ": " << r["faults"].dump();
  expect_no_leaks(r);
}

}  // namespace
}  // namespace kvferry_itest
