#include "kvferry/registry.h"

#include <gtest/gtest.h>

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
