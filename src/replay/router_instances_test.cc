#include "replay/router_instances.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "kvferry/routing.h"

namespace kvferry::replay {
namespace {

TEST(LeastOutstanding, SmallestThenTieThenLowestIndex) {
  EXPECT_EQ(least_outstanding({}), 0u);
  EXPECT_EQ(least_outstanding({3, 1, 1, 2}), 1u);
  EXPECT_EQ(least_outstanding({0, 0, 0}), 0u);
  const std::vector<uint64_t> tie = {5, 2, 1};
  EXPECT_EQ(least_outstanding({1, 1, 1}, &tie), 2u);
  EXPECT_EQ(least_outstanding({1, 1, 2}, &tie), 1u);
}

TEST(EngineInstances, PicksTheLeastLoadedAndUsesEveryPair) {
  EngineInstances in(2, 1, 2, 1, {}, {});
  EXPECT_EQ(in.instances(Role::kPrefill), 2u);
  EXPECT_EQ(in.groups(), 4u);
  // Two requests in flight at a time, then both finish: the loads stay equal, so the lowest index
  // alone would pair prefill i with decode i for good; the decode tie-break spreads the pairs.
  std::set<std::pair<uint32_t, uint32_t>> pairs;
  for (int i = 0; i < 8; ++i) {
    auto [p, d] = in.pick();
    in.dispatched(p, d);
    pairs.insert({p, d});
    if (i % 2 == 1) {  // two in flight, then both finish
      in.finished(Role::kPrefill, 0);
      in.finished(Role::kPrefill, 1);
      in.finished(Role::kDecode, 0);
      in.finished(Role::kDecode, 1);
    }
  }
  EXPECT_EQ(pairs.size(), 4u) << "every decode instance served every prefill instance";
  // Outstanding requests steer the choice.
  EngineInstances busy(3, 1, 2, 1, {}, {});
  busy.dispatched(0, 0);
  busy.dispatched(1, 0);
  EXPECT_EQ(busy.pick(), (std::pair<uint32_t, uint32_t>{2, 1}));
  busy.finished(Role::kPrefill, 7);  // no such count below zero or out of range is touched
  EXPECT_EQ(busy.outstanding(Role::kPrefill, 0), 1u);
}

TEST(EngineInstances, LeadersByInstanceAndGroup) {
  EngineInstances in(2, 2, 1, 1, {"a0", "a1", "b0"}, {"d"});
  EXPECT_EQ(in.leaders(Role::kPrefill, 0), (std::vector<std::string>{"a0", "a1"}));
  EXPECT_EQ(in.leaders(Role::kPrefill, 1), (std::vector<std::string>{"b0", ""}));
  const uint64_t room = 12345;
  EXPECT_EQ(in.leader_for(Role::kPrefill, 0, room), dp_rank_for_room(room, 2) == 0 ? "a0" : "a1");
  EXPECT_EQ(in.leader_for(Role::kDecode, 0, room), "d");
}

}  // namespace
}  // namespace kvferry::replay

namespace kvferry::replay {
namespace {

TEST(EngineInstances, PicksOnlyLiveInstances) {
  EngineInstances in(3, 1, 2, 1, {}, {});
  in.set_live(Role::kPrefill, 0, false);
  in.set_live(Role::kDecode, 0, false);
  for (int i = 0; i < 6; ++i) {
    auto [p, d] = in.pick();
    EXPECT_NE(p, 0u);
    EXPECT_EQ(d, 1u);
    in.dispatched(p, d);
  }
  EXPECT_EQ(in.outstanding(Role::kPrefill, 1), 3u);
  EXPECT_EQ(in.outstanding(Role::kPrefill, 2), 3u);
  in.set_live(Role::kPrefill, 0, true);
  EXPECT_EQ(in.pick().first, 0u);  // live again and the least loaded
}

TEST(EngineInstances, AJoinedPrefillGetsRoomsUnderLightLoad) {
  // Every request finishes before the next: the outstanding counts are always equal, and the
  // least recently chosen prefill instance comes first (the lowest index alone would starve 1).
  EngineInstances in(2, 1, 1, 1, {}, {});
  in.set_live(Role::kPrefill, 1, false);
  for (int i = 0; i < 3; ++i) {
    auto [p, d] = in.pick();
    EXPECT_EQ(p, 0u);
    in.dispatched(p, d);
    in.finished(Role::kPrefill, p);
    in.finished(Role::kDecode, d);
  }
  in.set_live(Role::kPrefill, 1, true);  // joined
  std::vector<uint32_t> chosen;
  for (int i = 0; i < 4; ++i) {
    auto [p, d] = in.pick();
    chosen.push_back(p);
    in.dispatched(p, d);
    in.finished(Role::kPrefill, p);
    in.finished(Role::kDecode, d);
  }
  EXPECT_EQ(chosen, (std::vector<uint32_t>{1, 0, 1, 0}));
}

}  // namespace
}  // namespace kvferry::replay
