#include "kvferry/write_fence.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvferry {
namespace {

TEST(WriteFence, UnknownRoomIsRefused) {
  WriteFence f;
  EXPECT_FALSE(f.pin(7));
  EXPECT_FALSE(f.is_open(7));
  EXPECT_EQ(f.close(7), 0u);
  EXPECT_EQ(f.pinned(7), 0u);
  EXPECT_EQ(f.open_rooms(), 0u);
}

TEST(WriteFence, OpenAdmitsOnlyItsRanges) {
  WriteFence f;
  ASSERT_TRUE(f.open(1, {{100, 50}, {300, 10}}).ok());
  EXPECT_TRUE(f.is_open(1));
  WriteFence::Pin p = f.pin(1);
  ASSERT_TRUE(p);
  EXPECT_EQ(p.room(), 1u);
  EXPECT_TRUE(p.contains(100, 50));
  EXPECT_TRUE(p.contains(120, 30));
  EXPECT_TRUE(p.contains(300, 10));
  EXPECT_TRUE(p.contains(149, 1));
  EXPECT_TRUE(p.contains(110, 0));   // zero bytes inside a range
  EXPECT_FALSE(p.contains(99, 1));   // before the first range
  EXPECT_FALSE(p.contains(99, 10));  // starts before, ends inside
  EXPECT_FALSE(p.contains(140, 11)); // one byte past the end
  EXPECT_FALSE(p.contains(150, 1));  // the gap
  EXPECT_FALSE(p.contains(150, 0));  // zero bytes at an end is outside
  EXPECT_FALSE(p.contains(200, 10)); // the gap
  EXPECT_FALSE(p.contains(310, 1));  // after the last
  EXPECT_FALSE(p.contains(0, 0));
}

TEST(WriteFence, StraddlingTwoRangesIsRefusedUnlessTheyTouch) {
  WriteFence f;
  // Two pages with a one-byte gap, and two touching pages (coalesced into one range).
  ASSERT_TRUE(f.open(1, {{0, 64}, {65, 64}, {1000, 64}, {1064, 64}}).ok());
  auto p = f.pin(1);
  EXPECT_FALSE(p.contains(60, 10));  // over the gap
  EXPECT_TRUE(p.contains(1000, 128));
  EXPECT_TRUE(p.contains(1060, 8));  // over the seam of touching pages
  EXPECT_EQ(f.ranges(1).size(), 3u);
}

TEST(WriteFence, RangesAreSortedAndCoalesced) {
  WriteFence f;
  ASSERT_TRUE(f.open(5, {{500, 10}, {0, 10}, {10, 10}, {5, 3}, {505, 20}, {100, 0}}).ok());
  std::vector<FenceRange> r = f.ranges(5);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].offset, 0u);
  EXPECT_EQ(r[0].bytes, 20u);
  EXPECT_EQ(r[1].offset, 500u);
  EXPECT_EQ(r[1].bytes, 25u);
}

TEST(WriteFence, OverflowSafe) {
  WriteFence f;
  EXPECT_FALSE(f.open(1, {{UINT64_MAX - 4, 10}}).ok());  // end overflows
  EXPECT_FALSE(f.is_open(1));
  EXPECT_FALSE(f.open(1, {}).ok());
  EXPECT_FALSE(f.open(1, {{10, 0}}).ok());  // nothing but empty ranges
  ASSERT_TRUE(f.open(2, {{UINT64_MAX - 10, 10}}).ok());  // ends exactly at UINT64_MAX
  auto p = f.pin(2);
  EXPECT_TRUE(p.contains(UINT64_MAX - 10, 10));
  EXPECT_FALSE(p.contains(UINT64_MAX - 10, 11));
  EXPECT_FALSE(p.contains(UINT64_MAX - 5, UINT64_MAX));  // offset + bytes wraps
  EXPECT_FALSE(p.contains(UINT64_MAX, 1));
  ASSERT_TRUE(f.open(3, {{100, 10}}).ok());
  auto q = f.pin(3);
  EXPECT_FALSE(q.contains(105, UINT64_MAX));  // wraps to a small end
  EXPECT_FALSE(q.contains(UINT64_MAX, 2));
}

TEST(WriteFence, CloseRefusesLaterWritesAndCountsRunningPlacements) {
  WriteFence f;
  ASSERT_TRUE(f.open(9, {{0, 4096}}).ok());
  WriteFence::Pin running = f.pin(9);  // e.g. a rendezvous receive under way
  ASSERT_TRUE(running);
  EXPECT_EQ(f.pinned(9), 1u);
  EXPECT_EQ(f.close(9), 1u);
  EXPECT_FALSE(f.is_open(9));
  EXPECT_EQ(f.open_rooms(), 0u);
  EXPECT_FALSE(f.pin(9));                   // closed: refused
  EXPECT_TRUE(running.contains(0, 4096));   // the running placement still sees its ranges
  EXPECT_FALSE(f.open(9, {{0, 64}}).ok());  // same id while a placement still runs
  running.release();
  EXPECT_FALSE(running);
  EXPECT_EQ(f.pinned(9), 0u);
  EXPECT_EQ(f.close(9), 0u);
  ASSERT_TRUE(f.open(9, {{0, 64}}).ok());  // the id may be opened again once nothing runs
  EXPECT_TRUE(f.pin(9).contains(0, 64));
  EXPECT_FALSE(f.pin(9).contains(64, 1));
  EXPECT_FALSE(f.open(9, {{0, 64}}).ok());  // already open
}

TEST(WriteFence, PinMovesAndReleasesOnce) {
  WriteFence f;
  ASSERT_TRUE(f.open(1, {{0, 8}}).ok());
  WriteFence::Pin a = f.pin(1);
  WriteFence::Pin b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(f.pinned(1), 1u);
  WriteFence::Pin c = f.pin(1);
  EXPECT_EQ(f.pinned(1), 2u);
  c = std::move(b);  // releases c's own pin
  EXPECT_EQ(f.pinned(1), 1u);
  c.release();
  c.release();
  EXPECT_EQ(f.pinned(1), 0u);
}

TEST(WriteFence, CountsRefusals) {
  WriteFence f;
  f.count_refusal(FenceVerdict::kRoomClosed);
  f.count_refusal(FenceVerdict::kOutsideRoom);
  f.count_refusal(FenceVerdict::kOutsideRoom);
  EXPECT_EQ(f.refused_closed(), 1u);
  EXPECT_EQ(f.refused_outside(), 2u);
  EXPECT_EQ(f.refused(), 3u);
  EXPECT_STREQ(fence_verdict_name(FenceVerdict::kRoomClosed), "room not open");
}

// Progress threads pin and release while the endpoint thread opens and closes rooms: no pin ever
// sees a closed room's entry freed under it (run under TSan/ASan by make test-sanitize).
TEST(WriteFence, ConcurrentOpenClosePin) {
  WriteFence f;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> admitted{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      uint64_t room = 0;
      while (!stop.load()) {
        WriteFence::Pin p = f.pin(room % 8);
        if (p && p.contains((room % 8) * 4096, 4096)) admitted.fetch_add(1);
        ++room;
      }
    });
  }
  for (int round = 0; round < 2000; ++round) {
    const uint64_t room = uint64_t(round) % 8;
    if (f.is_open(room)) {
      f.close(room);
    } else if (f.pinned(room) == 0) {
      ASSERT_TRUE(f.open(room, {{room * 4096, 4096}}).ok());
    }
  }
  stop.store(true);
  for (auto& t : readers) t.join();
  for (uint64_t room = 0; room < 8; ++room) {
    f.close(room);
    EXPECT_EQ(f.pinned(room), 0u);
  }
  EXPECT_EQ(f.open_rooms(), 0u);
}

}  // namespace
}  // namespace kvferry
