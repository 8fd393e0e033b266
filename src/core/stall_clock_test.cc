// StallClock: gaps beyond the allowance are counted once each, and a silence is reduced by the
// stalls inside it only.
#include "stall_clock.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(StallClock, OnlyGapsBeyondTheAllowanceCount) {
  StallClock c(100 * kMs);
  EXPECT_EQ(c.tick(1000 * kMs), 0);  // the first tick has no gap
  EXPECT_EQ(c.tick(1050 * kMs), 0);
  EXPECT_EQ(c.tick(1150 * kMs), 0);  // exactly the allowance: normal
  EXPECT_EQ(c.tick(1400 * kMs), 150 * kMs);
  EXPECT_EQ(c.tick(1401 * kMs), 150 * kMs);
  EXPECT_EQ(c.tick(3401 * kMs), 2050 * kMs);
  EXPECT_EQ(c.max_stall_ns(), 1900 * kMs);
  EXPECT_EQ(c.tick(3000 * kMs), 2050 * kMs);  // a clock going back adds nothing
  EXPECT_EQ(c.tick(3450 * kMs), 2050 * kMs);
}

TEST(StallClock, SilenceExcludesOnlyTheStallsInsideIt) {
  StallClock c(10 * kMs);
  c.tick(0 * kMs + 1);
  c.tick(500 * kMs);  // a 490 ms stall before the silence began
  const int64_t since = 500 * kMs, mark = c.stalled_ns();
  EXPECT_EQ(mark, 490 * kMs - 1);
  c.tick(505 * kMs);
  EXPECT_EQ(c.silence(505 * kMs, since, mark), 5 * kMs);
  c.tick(2505 * kMs);  // the judge itself stalled 1990 ms
  EXPECT_EQ(c.silence(2505 * kMs, since, mark), 15 * kMs);
  c.tick(2510 * kMs);
  EXPECT_EQ(c.silence(3000 * kMs, since, mark), 510 * kMs);  // awake since: it counts again
  EXPECT_EQ(c.silence(since, since + kMs, mark), 0);         // never negative
}

}  // namespace
}  // namespace kvferry
