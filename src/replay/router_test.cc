#include "replay/router.h"

#include <gtest/gtest.h>

#include <set>

#include "kvferry/routing.h"
#include "replay/fault_plan.h"

namespace kvferry::replay {
namespace {

std::vector<TraceRequest> trace_of(size_t n) {
  std::vector<TraceRequest> t;
  for (size_t i = 0; i < n; ++i) {
    // Arrivals out of order on purpose: the plan sorts them stably.
    t.push_back({.arrival_ms = (i % 3 == 0) ? 5u : 1u, .input_tokens = 100 + i,
                 .output_tokens = i, .line = i + 1});
  }
  return t;
}

TEST(PlanRequests, DeterministicUniqueRooms) {
  auto a = plan_requests(trace_of(500), 42, fault_rate_plan(0.3), 2, 4);
  auto b = plan_requests(trace_of(500), 42, fault_rate_plan(0.3), 2, 4);
  auto c = plan_requests(trace_of(500), 43, fault_rate_plan(0.3), 2, 4);
  auto d = plan_requests(trace_of(500), 42, FaultPlan{}, 2, 4);
  ASSERT_EQ(a.size(), 500u);
  std::set<uint64_t> rooms;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].room, b[i].room);
    EXPECT_EQ(a[i].fault.has_value(), b[i].fault.has_value());
    EXPECT_EQ(a[i].room, d[i].room);  // rooms do not depend on the fault plan
    EXPECT_NE(a[i].room, 0u);
    EXPECT_LT(a[i].room, 1ULL << 63);
    rooms.insert(a[i].room);
  }
  EXPECT_EQ(rooms.size(), 500u);
  EXPECT_NE(a[0].room, c[0].room);
}

TEST(PlanRequests, SortsByArrivalStably) {
  auto p = plan_requests(trace_of(9), 1, FaultPlan{}, 1, 1);
  // Trace order: 0(5) 1(1) 2(1) 3(5) 4(1) 5(1) 6(5) 7(1) 8(1).
  std::vector<uint64_t> tokens;
  for (const auto& q : p) tokens.push_back(q.input_tokens);
  EXPECT_EQ(tokens, (std::vector<uint64_t>{101, 102, 104, 105, 107, 108, 100, 103, 106}));
  EXPECT_EQ(p[0].arrival_ms, 1u);
  EXPECT_EQ(p.back().arrival_ms, 5u);
  EXPECT_EQ(p[0].output_tokens, 1u);
}

TEST(PlanRequests, FaultRateShorthandKindsAndRanks) {
  for (const auto& q : plan_requests(trace_of(200), 7, fault_rate_plan(0.0), 2, 2)) {
    EXPECT_FALSE(q.fault.has_value());
  }
  auto all = plan_requests(trace_of(400), 7, fault_rate_plan(1.0), 2, 3);
  std::set<std::string> prefill_at, decode_at;
  for (const auto& q : all) {
    ASSERT_TRUE(q.fault.has_value());
    if (q.fault->kind == FaultKind::kTransfer) {
      prefill_at.insert(q.fault->at.str());
    } else {
      EXPECT_EQ(q.fault->kind, FaultKind::kDecodeFail);
      decode_at.insert(q.fault->at.str());
    }
  }
  EXPECT_EQ(prefill_at, (std::set<std::string>{"prefill/tp0", "prefill/tp1"}));
  EXPECT_EQ(decode_at, (std::set<std::string>{"decode/tp0", "decode/tp1", "decode/tp2"}));
  auto some = plan_requests(trace_of(2000), 7, fault_rate_plan(0.2), 1, 1);
  size_t n = 0;
  for (const auto& q : some) n += q.fault ? 1 : 0;
  EXPECT_GT(n, 300u);  // 400 expected; 5+ sigma margins
  EXPECT_LT(n, 500u);
}

// With DP groups, a room's fault names the rank of the group that serves the room, by the same
// rule the ranks use (dp_rank_for_room), so the rank that acts on it is the one that has the room.
TEST(PlanRequests, FaultsLandInTheRoomsDpGroup) {
  auto plan = *parse_fault_plan("transfer@prefill:0.5,decode_fail@decode:0.5", 2, 2, 2, 3);
  std::set<std::string> groups;
  for (const auto& q : plan_requests(trace_of(300), 9, plan, 2, 2, 2, 3)) {
    ASSERT_TRUE(q.fault.has_value());
    const RankId* at = &q.fault->at;
    const uint32_t dp = at->role == Role::kPrefill ? 2 : 3;
    EXPECT_EQ(at->dp_rank, dp_rank_for_room(q.room, dp)) << q.fault->str() << " room " << q.room;
    EXPECT_EQ(at->dp_rank, q.room % dp);
    groups.insert(std::string(role_name(at->role)) + std::to_string(at->dp_rank));
  }
  EXPECT_EQ(groups, (std::set<std::string>{"prefill0", "prefill1", "decode0", "decode1", "decode2"}));
  // DP 1: unchanged names.
  for (const auto& q : plan_requests(trace_of(50), 9, plan, 2, 2)) {
    ASSERT_TRUE(q.fault.has_value());
    EXPECT_EQ(q.fault->at.str().find("/dp"), std::string::npos) << q.fault->str();
  }
}

}  // namespace
}  // namespace kvferry::replay
