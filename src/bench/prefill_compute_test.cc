// The bench's simulated forward pass (prefill_compute.h): layer ends at start + (l + 1) x the
// per-layer time, one room at a time in FIFO order, the next room starting when the previous one's
// last layer ends (or when it becomes ready, if later). Times are passed in; no clock.
#include "bench/prefill_compute.h"

#include <gtest/gtest.h>

namespace kvferry::bench {
namespace {

TEST(PrefillCompute, LayersEndOnScheduleOneRoomAfterTheOther) {
  PrefillCompute c(3, 10);
  EXPECT_TRUE(c.idle());
  EXPECT_EQ(c.next_event_ns(), std::numeric_limits<int64_t>::max());
  c.enqueue(7, 100);
  c.enqueue(8, 105);
  EXPECT_EQ(c.next_event_ns(), 110);
  EXPECT_TRUE(c.advance(109).empty());
  auto a = c.advance(125);  // layers 0 and 1 of room 7 (ends 110, 120)
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].room, 7u);
  EXPECT_EQ(a[0].layer, 0u);
  EXPECT_EQ(a[0].end_ns, 110);
  EXPECT_EQ(a[1].end_ns, 120);
  EXPECT_FALSE(a[1].last);
  EXPECT_EQ(c.next_event_ns(), 130);
  // Late: room 7's last layer and room 8's first two (room 8 starts at 130, not at 155).
  auto b = c.advance(155);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].room, 7u);
  EXPECT_TRUE(b[0].last);
  EXPECT_EQ(b[0].end_ns, 130);
  EXPECT_EQ(b[1].room, 8u);
  EXPECT_EQ(b[1].end_ns, 140);
  EXPECT_EQ(b[2].end_ns, 150);
  auto d = c.advance(1000);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].last);
  EXPECT_EQ(d[0].end_ns, 160);
  EXPECT_TRUE(c.idle());
  // An idle device starts a room when it is ready.
  c.enqueue(9, 2000);
  EXPECT_EQ(c.next_event_ns(), 2010);
  EXPECT_EQ(c.advance(2030).back().end_ns, 2030);
}

TEST(PrefillCompute, ZeroTimePerLayerFinishesEveryLayerAtOnce) {
  PrefillCompute c(4, 0);
  c.enqueue(1, 50);
  auto a = c.advance(50);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_TRUE(a[3].last);
  EXPECT_EQ(a[3].end_ns, 50);
}

}  // namespace
}  // namespace kvferry::bench
