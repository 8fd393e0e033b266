#include <gtest/gtest.h>

#include "driver/engine.h"

namespace kvferry {
namespace {

RoomReport rep(uint32_t tp, KVPoll p) {
  RoomReport r;
  r.tp_rank = tp;
  r.poll = p;
  r.drained = true;
  return r;
}

TEST(Reduce, MinOverRanksMakesOneFailureEveryones) {
  auto a = rep(0, KVPoll::Success);
  auto b = rep(1, KVPoll::Failed);
  b.has_failure = true;
  b.origin = "prefill/tp1";
  b.code = ErrorCode::kTransferError;
  b.first_seen_ns = 100;
  b.failed_ns = 150;
  RoomReduction r = reduce_room({a, b});
  EXPECT_EQ(r.min_poll, KVPoll::Failed);
  EXPECT_TRUE(r.any_failure);
  EXPECT_EQ(r.winner.origin, "prefill/tp1");
  EXPECT_EQ(r.ranks_failed, 1u);
  EXPECT_EQ(r.max_failed_ns, 150);
}

TEST(Reduce, TheRootCauseRulePicksTheWinnerInAnyReportOrder) {
  constexpr int64_t kMs = 1'000'000;
  auto a = rep(0, KVPoll::Failed);
  a.has_failure = true;
  a.code = ErrorCode::kWaitingTimeout;
  a.origin = "decode/tp0";
  a.first_seen_ns = 200 * kMs;
  auto b = rep(1, KVPoll::Failed);
  b.has_failure = true;
  b.code = ErrorCode::kWaitingTimeout;
  b.origin = "decode/tp1";
  b.first_seen_ns = 100 * kMs;
  EXPECT_EQ(reduce_room({a, b}).winner.origin, "decode/tp1");  // a window earlier
  EXPECT_EQ(reduce_room({b, a}).winner.origin, "decode/tp1");
  b.first_seen_ns = 203 * kMs;  // the same window (200..205 ms): the fixed rank order decides
  EXPECT_EQ(reduce_room({a, b}).winner.origin, "decode/tp0");
  EXPECT_EQ(reduce_room({b, a}).winner.origin, "decode/tp0");
  b.code = ErrorCode::kTransferError;  // a cause beats a timeout in the same window
  EXPECT_EQ(reduce_room({a, b}).winner.origin, "decode/tp1");
  // The wall clock is the rule's clock when both carry it.
  a.wall_ns = 1'000 * kMs;
  b.wall_ns = 1'100 * kMs;
  EXPECT_EQ(reduce_room({b, a}).winner.origin, "decode/tp0");
  EXPECT_EQ(reduce_room({b, a}).winner.wall_ns, 1'000 * kMs);
}

TEST(Reduce, SuccessOnlyWhenEveryRankSucceeded) {
  EXPECT_EQ(reduce_room({rep(0, KVPoll::Success), rep(1, KVPoll::Transferring)}).min_poll, KVPoll::Transferring);
  EXPECT_EQ(reduce_room({rep(0, KVPoll::Success), rep(1, KVPoll::Success)}).min_poll, KVPoll::Success);
  auto c = rep(1, KVPoll::Success);
  c.drained = false;
  EXPECT_FALSE(reduce_room({rep(0, KVPoll::Success), c}).all_drained);
}

TEST(Reduce, SumsBytesAndKeepsEarliestSend) {
  auto a = rep(0, KVPoll::Success);
  a.bytes = 10;
  a.send_ns = 50;
  auto b = rep(1, KVPoll::Success);
  b.bytes = 5;
  b.send_ns = 40;
  RoomReduction r = reduce_room({a, b});
  EXPECT_EQ(r.bytes, 15u);
  EXPECT_EQ(r.min_send_ns, 40);
}

}  // namespace
}  // namespace kvferry
