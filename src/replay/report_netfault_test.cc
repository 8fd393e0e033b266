// The report's network fault checks (report_netfault.cc).
#include <gtest/gtest.h>

#include "endpoint/peer_monitor.h"
#include "replay/report.h"

namespace kvferry::replay {
namespace {

constexpr int64_t kMs = 1'000'000;

// A room with both engines' results: ok, or failed with `origin` at both (failed_all at `done`).
RequestOutcome room(uint64_t id, int64_t dispatched_ms, bool ok, int64_t done_ms, const std::string& origin = "") {
  RequestOutcome q;
  q.room = id;
  q.dispatched_ns = dispatched_ms * kMs;
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    RoomResult r;
    r.role = role;
    r.room = id;
    r.state = ok ? KVPoll::Success : KVPoll::Failed;
    r.code = ok ? ErrorCode::kOk : ErrorCode::kPeerUnreachable;
    r.origin = ok ? "" : origin;
    r.reason = ok ? "" : origin + " unreachable";
    r.success_ns = ok ? done_ms * kMs : 0;
    r.first_failed_ns = ok ? 0 : done_ms * kMs;
    r.failed_all_ns = ok ? 0 : done_ms * kMs;
    r.ranks_failed = ok ? 0 : 1;
    (role == Role::kPrefill ? q.prefill : q.decode) = r;
  }
  return q;
}

const std::map<std::string, std::string> kHosts = {
    {"prefill/tp0", "h1"}, {"prefill/tp1", "h1"}, {"decode/tp0", "h2"}, {"decode/tp1", "h2"}};

NetFaultRecord partition_of_h2() { return {"partition", "h2", 3000, 1000 * kMs, 4000 * kMs, {}, ""}; }

LogScan lines(const std::vector<std::pair<std::string, std::string>>& detector_peer, int64_t at_ms) {
  LogScan logs;
  logs.lines = 1;
  for (const auto& [rank, peer] : detector_peer) logs.peer_dead.push_back({rank, peer, at_ms * kMs, true});
  return logs;
}

TEST(NetFaultChecks, PartitionFailuresAcrossTheCutAreItsAndTimed) {
  ReplayResults res;
  res.requests.push_back(room(1, 500, true, 600));                  // done before the start
  res.requests.push_back(room(2, 900, false, 1800, "decode/tp0"));  // in flight: failed 800 ms after the start
  res.requests.push_back(room(3, 1500, false, 4200, "decode/tp1")); // dispatched during it
  res.requests.push_back(room(4, 4100, true, 4300));                // after the heal: 300 ms
  res.requests.push_back(room(5, 4200, true, 4400));
  const LogScan logs = lines({{"prefill/tp0", "decode/tp0"}, {"prefill/tp1", "decode/tp1"}, {"decode/tp0", "prefill/tp0"}},
                             1800);
  Report rep = build_report(res, logs, {}, 2, 2);
  EXPECT_EQ(rep.unexpected_failures.size(), 2u);
  EXPECT_EQ(rep.unexplained_peer_dead.size(), 3u);
  add_net_fault_checks(rep, res, {partition_of_h2()}, kHosts, 800);
  ASSERT_EQ(rep.net_faults.size(), 1u);
  const NetFaultEntry& e = rep.net_faults[0];
  EXPECT_TRUE(e.beyond_timeout);
  EXPECT_EQ(e.detection_bound_ms, PeerMonitor::kUnreachableFactor * 800);
  EXPECT_TRUE(e.must_detect);
  EXPECT_EQ(e.rooms_affected, 2u);
  EXPECT_EQ(e.rooms_failed, 2u);
  EXPECT_EQ(e.rooms_misattributed, 0u);
  EXPECT_EQ(e.to_all_failed_ms.count, 2u);
  EXPECT_DOUBLE_EQ(e.to_all_failed_ms.p50, 800.0);
  EXPECT_DOUBLE_EQ(e.to_all_failed_ms.max, 2700.0);  // from its dispatch at 1500 ms
  EXPECT_EQ(e.peer_dead_lines, 3u);
  EXPECT_TRUE(e.repeated_detections.empty());
  EXPECT_TRUE(e.undetected.empty());
  EXPECT_EQ(e.rooms_after, 2u);
  EXPECT_EQ(e.rooms_after_failed, 0u);
  EXPECT_DOUBLE_EQ(e.first_success_after_ms, 300.0);
  EXPECT_TRUE(rep.unexpected_failures.empty());  // the partition's
  EXPECT_TRUE(rep.unexplained_peer_dead.empty());
  std::vector<std::string> p;
  net_fault_problems(rep, p);
  EXPECT_TRUE(p.empty()) << p.front();
}

TEST(NetFaultChecks, WrongOriginRepeatedLinesFalseDeathsAndBlacklistsAreProblems) {
  ReplayResults res;
  res.requests.push_back(room(1, 900, false, 1800, "prefill/tp0"));  // the prefill engine blames its own side
  res.requests.push_back(room(2, 4100, true, 4300));
  res.requests.push_back(room(3, 4200, false, 4400, "decode/tp0"));  // after one succeeded: blacklisted
  const LogScan logs = lines({{"prefill/tp0", "decode/tp0"},
                              {"prefill/tp1", "decode/tp0"},    // the prefill engine twice for decode/tp0
                              {"prefill/tp0", "prefill/tp1"}},  // one side: a false death
                             1800);
  Report rep = build_report(res, logs, {}, 2, 2);
  add_net_fault_checks(rep, res, {partition_of_h2()}, kHosts, 800);
  const NetFaultEntry& e = rep.net_faults[0];
  EXPECT_EQ(e.rooms_misattributed, 1u);
  EXPECT_EQ(e.repeated_detections.size(), 1u);
  EXPECT_EQ(e.same_side_lines.size(), 1u);
  EXPECT_EQ(e.undetected, std::vector<std::string>{"decode/tp1"});
  EXPECT_EQ(e.rooms_after_failed, 1u);
  std::vector<std::string> p;
  net_fault_problems(rep, p);
  EXPECT_EQ(p.size(), 5u);
}

TEST(NetFaultChecks, ShortLinkDownKeepsRoomsAndANeverInjectedFaultIsAProblem) {
  ReplayResults res;
  res.requests.push_back(room(1, 900, true, 1300));  // in flight, survived: fine below the timeout
  NetFaultRecord f{"link_down", "h2", 300, 1000 * kMs, 1300 * kMs, {"eth0"}, ""};
  NetFaultRecord never{"partition", "h1", 3000, 0, 0, {}, ""};
  Report rep = build_report(res, lines({}, 0), {}, 2, 2);
  add_net_fault_checks(rep, res, {f, never}, kHosts, 800);
  ASSERT_EQ(rep.net_faults.size(), 2u);
  EXPECT_FALSE(rep.net_faults[0].beyond_timeout);
  EXPECT_EQ(rep.net_faults[0].rooms_affected, 1u);
  EXPECT_EQ(rep.net_faults[0].rooms_survived, 0u);  // succeeded 300 ms after the start: within the timeout
  std::vector<std::string> p;
  net_fault_problems(rep, p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("never injected"), std::string::npos) << p[0];
}

}  // namespace
// Between the heartbeat timeout and the detection bound a heal may come before the verdict: a
// partition of 1200 ms (bound 1600 ms) or a pause of 2500 ms (bound 3200 ms: the stopped rank's
// socket still accepts) that nobody was declared dead for is no problem; one of 3000 ms is.
TEST(NetFaultChecks, FaultsWithinTheDetectionBoundNeedNoVerdict) {
  ReplayResults res;
  res.requests.push_back(room(1, 4100, true, 4300));  // after the heal
  NetFaultRecord partition{"partition", "h2", 1200, 1000 * kMs, 2200 * kMs, {}, ""};
  NetFaultRecord pause{"pause", "decode/tp1", 2500, 1000 * kMs, 3500 * kMs, {}, ""};
  Report rep = build_report(res, lines({}, 0), {}, 2, 2);
  add_net_fault_checks(rep, res, {partition, pause, partition_of_h2()}, kHosts, 800);
  ASSERT_EQ(rep.net_faults.size(), 3u);
  EXPECT_TRUE(rep.net_faults[0].beyond_timeout);
  EXPECT_FALSE(rep.net_faults[0].must_detect);
  EXPECT_EQ(rep.net_faults[1].detection_bound_ms, PeerMonitor::kHungFactor * 800);
  EXPECT_FALSE(rep.net_faults[1].must_detect);
  EXPECT_TRUE(rep.net_faults[2].must_detect);
  EXPECT_EQ(rep.net_faults[2].undetected, (std::vector<std::string>{"decode/tp0", "decode/tp1"}));
  std::vector<std::string> p;
  net_fault_problems(rep, p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("partition of h2 (3000 ms): decode/tp0 was never declared dead"), std::string::npos) << p[0];
}

}  // namespace kvferry::replay
