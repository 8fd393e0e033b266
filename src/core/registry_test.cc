#include "kvferry/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace kvferry {
namespace {

const RankId kSelf{Role::kDecode, 0, 1, 0};
const RankId kPeer{Role::kPrefill, 0, 1, 0};

TEST(FailureRegistry, FirstCauseWinsAndGetIsStable) {
  FailureRegistry reg(kSelf);
  ASSERT_TRUE(reg.open(42));
  EXPECT_FALSE(reg.open(42));  // already open
  EXPECT_FALSE(reg.get(42).has_value());
  EXPECT_TRUE(reg.record(42, ErrorCode::kTransferError, "write failed", kPeer, 100));
  EXPECT_FALSE(reg.record(42, ErrorCode::kWaitingTimeout, "timed out", kSelf, 200));
  for (int i = 0; i < 2; ++i) {  // asking twice gives the same answer
    auto e = reg.get(42);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->bootstrap_room, 42u);
    EXPECT_EQ(e->code, ErrorCode::kTransferError);
    EXPECT_EQ(e->failure_reason, "write failed");
    EXPECT_EQ(e->origin, kPeer);
    EXPECT_TRUE(e->is_from_another_rank);
    EXPECT_EQ(e->first_seen_ns, 100);
  }
  auto sec = reg.secondary(42);
  ASSERT_EQ(sec.size(), 1u);
  EXPECT_EQ(sec[0].code, ErrorCode::kWaitingTimeout);
  EXPECT_FALSE(sec[0].is_from_another_rank);
  EXPECT_EQ(reg.records(), 1u);
}

TEST(FailureRegistry, LocalCauseIsNotFromAnotherRank) {
  FailureRegistry reg(kSelf);
  reg.open(1);
  ASSERT_TRUE(reg.record(1, ErrorCode::kPreallocTimeout, "no pages", kSelf, 5));
  EXPECT_FALSE(reg.get(1)->is_from_another_rank);
  EXPECT_EQ(reg.get(1)->str(), "room 1: prealloc_timeout at decode/tp1: no pages");
}

TEST(FailureRegistry, SecondaryIsBounded) {
  FailureRegistry reg(kSelf);
  reg.open(3);
  for (int i = 0; i < 10; ++i) reg.record(3, ErrorCode::kInjected, std::to_string(i), kSelf, i);
  EXPECT_EQ(reg.get(3)->failure_reason, "0");
  auto sec = reg.secondary(3);
  ASSERT_EQ(sec.size(), 4u);
  EXPECT_EQ(sec[0].failure_reason, "1");
  EXPECT_EQ(sec[3].failure_reason, "4");
}

TEST(FailureRegistry, RecordOnUnknownRoomIsDroppedAndCounted) {
  FailureRegistry reg(kSelf);
  EXPECT_FALSE(reg.record(9, ErrorCode::kAborted, "x", kSelf, 1));
  EXPECT_EQ(reg.dropped_records(), 1u);
  EXPECT_EQ(reg.records(), 0u);
  EXPECT_FALSE(reg.is_open(9));
  EXPECT_FALSE(reg.get(9).has_value());
}

TEST(FailureRegistry, ReleaseRemovesAndReopenStartsClean) {
  FailureRegistry reg(kSelf);
  reg.open(7);
  reg.record(7, ErrorCode::kPeerUnreachable, "peer died", kPeer, 1);
  EXPECT_EQ(reg.open_rooms(), 1u);
  EXPECT_TRUE(reg.release(7));
  EXPECT_FALSE(reg.release(7));
  EXPECT_FALSE(reg.is_open(7));
  EXPECT_EQ(reg.open_rooms(), 0u);
  EXPECT_EQ(reg.records(), 0u);
  EXPECT_FALSE(reg.get(7).has_value());
  // A late record for the old room arrives before the id is reused: dropped.
  EXPECT_FALSE(reg.record(7, ErrorCode::kTransferError, "late", kPeer, 2));
  EXPECT_EQ(reg.dropped_records(), 1u);
  ASSERT_TRUE(reg.open(7));
  EXPECT_FALSE(reg.get(7).has_value());
  EXPECT_TRUE(reg.secondary(7).empty());
}

const RankId kDecode0{Role::kDecode, 0, 0, 0};
constexpr int64_t kMs = 1'000'000;

TEST(FailureRegistry, ALaterWinnerReplacesThePrimaryAndTheLoserIsSuperseded) {
  FailureRegistry reg(kSelf);  // decode/tp1
  reg.open(5);
  // Its own waiting timeout first, then decode/tp0's (same window: tp0 wins by the rank order).
  ASSERT_TRUE(reg.record(5, ErrorCode::kWaitingTimeout, "mine", kSelf, 400 * kMs + 200'000));
  EXPECT_TRUE(reg.record(5, Failure{ErrorCode::kWaitingTimeout, kDecode0, "tp0's", 400 * kMs + 100'000, 0}, false));
  auto e = reg.get(5);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->origin, kDecode0);
  EXPECT_TRUE(e->is_from_another_rank);
  ASSERT_EQ(e->superseded.size(), 1u);
  EXPECT_EQ(e->superseded[0].origin, kSelf);
  EXPECT_EQ(e->superseded[0].reason, "mine");
  ASSERT_TRUE(reg.own(5));
  EXPECT_EQ(reg.own(5)->reason, "mine");
  EXPECT_EQ(reg.records(), 1u);
  // The same record again (the engine agreement repeats it): nothing changes.
  EXPECT_FALSE(reg.record(5, Failure{ErrorCode::kWaitingTimeout, kDecode0, "tp0's", 400 * kMs + 100'000, 0}, false));
  EXPECT_EQ(reg.get(5)->superseded.size(), 1u);
}

TEST(FailureRegistry, ALosingRecordIsKeptAsSuperseded) {
  FailureRegistry reg(kSelf);
  reg.open(5);
  ASSERT_TRUE(reg.record(5, Failure{ErrorCode::kTransferError, kPeer, "link", 100 * kMs, 0}, false));
  EXPECT_FALSE(reg.record(5, Failure{ErrorCode::kWaitingTimeout, kDecode0, "late", 300 * kMs, 0}, false));
  auto e = reg.get(5);
  EXPECT_EQ(e->origin, kPeer);
  ASSERT_EQ(e->superseded.size(), 1u);
  EXPECT_EQ(e->superseded[0].origin, kDecode0);
  EXPECT_FALSE(reg.own(5));
}

TEST(FailureRegistry, ALocalObservationAfterTheRoomFailedIsAConsequence) {
  FailureRegistry reg(kSelf);
  reg.open(5);
  // A record reached this rank; then a write of the room fails here (in flight when it failed).
  // Earlier by the rule (same window, a cause before a timeout) but not a root cause: secondary.
  ASSERT_TRUE(reg.record(5, Failure{ErrorCode::kWaitingTimeout, kDecode0, "t", 100 * kMs, 0}, false));
  EXPECT_FALSE(reg.record(5, ErrorCode::kTransferError, "cancelled", kSelf, 100 * kMs + 1));
  EXPECT_EQ(reg.get(5)->origin, kDecode0);
  EXPECT_TRUE(reg.get(5)->superseded.empty());
  ASSERT_EQ(reg.secondary(5).size(), 1u);
  EXPECT_EQ(reg.secondary(5)[0].code, ErrorCode::kTransferError);
  EXPECT_FALSE(reg.own(5));
}

TEST(FailureRegistry, LocalRecordsGetTheirWallClockStamped) {
  FailureRegistry reg(kSelf);
  reg.open(5);
  const int64_t seen = monotonic_ns();
  reg.record(5, ErrorCode::kInjected, "x", kSelf, seen);
  const int64_t wall = reg.get(5)->wall_ns;
  EXPECT_GT(wall, 0);
  EXPECT_LE(wall, realtime_ns());
  EXPECT_EQ(reg.get(5)->failure().wall_ns, wall);
  reg.open(6);  // a propagated record keeps what it carried
  reg.record(6, Failure{ErrorCode::kInjected, kPeer, "x", 1, 0}, false);
  EXPECT_EQ(reg.get(6)->wall_ns, 0);
}

TEST(FailureRegistry, PrimaryIsTheSameForEveryArrivalOrder) {
  std::vector<Failure> set = {
      {ErrorCode::kWaitingTimeout, kSelf, "a", 400 * kMs + 300'000, 0},
      {ErrorCode::kWaitingTimeout, kDecode0, "b", 400 * kMs + 100'000, 0},
      {ErrorCode::kTransferError, kPeer, "c", 412 * kMs, 0},
      {ErrorCode::kTransferError, RankId{Role::kPrefill, 0, 0, 0}, "d", 413 * kMs, 0},
  };
  auto by_time = [](const Failure& a, const Failure& b) { return a.first_seen_ns < b.first_seen_ns; };
  std::sort(set.begin(), set.end(), by_time);
  const Failure expected = *root_cause(set);
  int perms = 0;
  do {
    FailureRegistry reg(kSelf);
    reg.open(1);
    for (const Failure& f : set) reg.record(1, f, false);
    EXPECT_EQ(reg.get(1)->failure(), expected);
    EXPECT_EQ(reg.get(1)->superseded.size(), 3u);  // every loser kept once
    ++perms;
  } while (std::next_permutation(set.begin(), set.end(), by_time));
  EXPECT_EQ(perms, 24);
}

TEST(FailureRegistry, ConcurrentRecordsKeepOneFirstCause) {
  FailureRegistry reg(kSelf);
  constexpr int kRooms = 64;
  for (int r = 0; r < kRooms; ++r) reg.open(r);
  std::vector<std::thread> threads;
  std::atomic<int> firsts{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRooms; ++r) {
        if (reg.record(r, ErrorCode::kInjected, std::to_string(t), kSelf, t)) ++firsts;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(firsts.load(), kRooms);
  EXPECT_EQ(reg.records(), size_t(kRooms));
  for (int r = 0; r < kRooms; ++r) EXPECT_EQ(reg.secondary(r).size(), 3u);
}

}  // namespace
}  // namespace kvferry
