#include "replay/router_scale.h"

#include <gtest/gtest.h>

namespace kvferry::replay {
namespace {

constexpr int64_t kS = 1'000'000'000;

// 1 prefill + a joining one, 2 decode of which decode 1 leaves; one DP group each.
struct Fixture {
  EngineInstances inst{2, 1, 2, 1, {"tcp://p0", "tcp://p1"}, {"tcp://d0", "tcp://d1"}};
  RouterScale scale{*parse_scale("t=1s:+prefill,t=2s:-decode", 1, 2), inst};
  std::vector<RequestOutcome> requests;
  std::vector<size_t> inflight;
  std::vector<std::string> left;
  Status advance(int64_t now) {
    return scale.advance(now, inflight, requests, [this](const std::string& l) {
      left.push_back(l);
      return Status::Ok();
    }, 10, 10);
  }
  // Dispatches one request where pick() says; returns its instances.
  std::pair<uint32_t, uint32_t> dispatch(int64_t now) {
    auto [p, d] = inst.pick();
    requests.emplace_back();
    requests.back().prefill_instance = p;
    requests.back().decode_instance = d;
    inflight.push_back(requests.size() - 1);
    inst.dispatched(p, d);
    scale.on_dispatch(requests.size() - 1, p, d, now);
    return {p, d};
  }
};

TEST(RouterScale, JoinIsChosenOnlyAfterReady) {
  Fixture f;
  f.scale.start(100 * kS);
  EXPECT_FALSE(f.inst.live(Role::kPrefill, 1));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f.dispatch(100 * kS).first, 0u);  // prefill 1 not ready
  ASSERT_TRUE(f.advance(101 * kS).ok());
  EXPECT_FALSE(f.scale.on_ready(Role::kDecode, 0, 0));  // not a joining instance
  EXPECT_TRUE(f.scale.on_ready(Role::kPrefill, 1, 0));
  f.scale.joined(Role::kPrefill, 1, 101 * kS + 5);
  EXPECT_TRUE(f.inst.live(Role::kPrefill, 1));
  EXPECT_EQ(f.dispatch(101 * kS + 6).first, 1u);  // the least loaded now
  const auto rec = f.scale.records(f.requests);
  EXPECT_EQ(rec[0].ready_ns, 101 * kS + 5);
  EXPECT_EQ(rec[0].first_room_ns, 101 * kS + 6);
  EXPECT_EQ(rec[0].rooms, 1u);
}

TEST(RouterScale, LeaveStopsChoiceDrainsThenSendsLeave) {
  Fixture f;
  f.scale.start(100 * kS);
  // Decode 0 and 1 get one each before the event.
  f.dispatch(100 * kS);
  f.dispatch(100 * kS);
  ASSERT_EQ(f.inst.outstanding(Role::kDecode, 1), 1u);
  ASSERT_TRUE(f.advance(102 * kS).ok());  // the leave's event: decode 1 is no longer chosen
  EXPECT_FALSE(f.inst.live(Role::kDecode, 1));
  EXPECT_TRUE(f.left.empty()) << "a room is still in flight there";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f.dispatch(102 * kS).second, 0u);
  // Decode 1's room finishes (and fails): the leave goes out; its stats mean it left.
  f.inst.finished(Role::kDecode, 1);
  f.requests[1].error = "room failed";
  ASSERT_TRUE(f.advance(102 * kS + 10).ok());
  ASSERT_EQ(f.left, std::vector<std::string>{"tcp://d1"});
  EXPECT_FALSE(f.scale.settled());  // the join is not ready yet, the leave not ended
  f.scale.on_stats(Role::kDecode, 1, 0, 102 * kS + 20);
  EXPECT_TRUE(f.scale.left(Role::kDecode, 1));
  const auto rec = f.scale.records(f.requests);
  EXPECT_EQ(rec[1].in_flight_at_event, 1u);
  EXPECT_EQ(rec[1].rooms, 0u);
  EXPECT_EQ(rec[1].failed_rooms_caused, 1u);  // the one in flight at the event
  EXPECT_EQ(rec[1].left_ns, 102 * kS + 20);
}

TEST(RouterScale, ALeaveOfAJoiningInstanceWaitsForItsJoin) {
  EngineInstances inst{1, 1, 2, 1, {"tcp://p0"}, {"tcp://d0"}};
  RouterScale scale{*parse_scale("t=1s:+decode,t=1.5s:-decode", 1, 1), inst};
  std::vector<RequestOutcome> requests;
  std::vector<std::string> left;
  auto advance = [&](int64_t now) {
    return scale.advance(now, {}, requests, [&](const std::string& l) {
      left.push_back(l);
      return Status::Ok();
    }, 10, 10);
  };
  scale.start(0);
  ASSERT_TRUE(advance(2 * kS).ok());
  EXPECT_TRUE(left.empty()) << "decode 1 has not joined: no leaders to tell yet";
  inst.leaders(Role::kDecode, 1)[0] = "tcp://d1";
  ASSERT_TRUE(scale.on_ready(Role::kDecode, 1, 0));
  scale.joined(Role::kDecode, 1, 2 * kS + 1);
  ASSERT_TRUE(advance(2 * kS + 2).ok());
  EXPECT_FALSE(inst.live(Role::kDecode, 1));
  EXPECT_EQ(left, std::vector<std::string>{"tcp://d1"});
  scale.on_stats(Role::kDecode, 1, 0, 2 * kS + 3);
  EXPECT_TRUE(scale.settled());
}

TEST(RouterScale, AJoinNotReadyInTimeIsAnError) {
  Fixture f;
  f.scale.start(100 * kS);
  ASSERT_TRUE(f.advance(101 * kS).ok());
  EXPECT_EQ(f.advance(112 * kS).code(), ErrorCode::kWaitingTimeout);
}

}  // namespace
}  // namespace kvferry::replay
