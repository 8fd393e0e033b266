#include "replay/progress.h"

#include <gtest/gtest.h>

namespace kvferry::replay {
namespace {

RoomResult result(Role role, KVPoll state, uint64_t bytes = 0, bool rejected = false) {
  RoomResult r;
  r.role = role;
  r.state = state;
  r.bytes_transferred = bytes;
  r.rejected = rejected;
  return r;
}

ReplayResults sample() {
  ReplayResults r;
  r.dispatch_start_ns = 1'000'000'000;
  r.requests.resize(6);
  for (size_t i = 0; i < 5; ++i) r.requests[i].dispatched_ns = 1'000'000'000 + int64_t(i);
  r.requests[0].prefill = result(Role::kPrefill, KVPoll::Success, 3'000'000'000);
  r.requests[0].decode = result(Role::kDecode, KVPoll::Success);
  r.requests[1].prefill = result(Role::kPrefill, KVPoll::Failed, 1'000'000'000);
  r.requests[1].decode = result(Role::kDecode, KVPoll::Failed);
  r.requests[2].prefill = result(Role::kPrefill, KVPoll::Failed);
  r.requests[2].decode = result(Role::kDecode, KVPoll::Failed, 0, /*rejected=*/true);
  r.requests[3].router_failure = "router: no result within 40 s";
  r.requests[4].prefill = result(Role::kPrefill, KVPoll::Success, 7);  // decode still running
  return r;
}

TEST(Progress, ClassifiesFinishedRequestsLikeTheReport) {
  const Progress p = progress_of(sample(), 3'000'000'000);
  EXPECT_EQ(p.total, 6u);
  EXPECT_EQ(p.dispatched, 5u);
  EXPECT_EQ(p.finished, 4u);
  EXPECT_EQ(p.succeeded, 1u);
  EXPECT_EQ(p.failed, 2u);  // one failed by the engines, one given up by the router
  EXPECT_EQ(p.rejected, 1u);
  EXPECT_EQ(p.bytes, 4'000'000'000u);  // the unfinished request's bytes are not counted yet
  EXPECT_DOUBLE_EQ(p.seconds, 2.0);
  EXPECT_DOUBLE_EQ(p.gb_per_s(), 2.0);
  EXPECT_EQ(progress_line(p),
            "replay: 4/6 requests done (ok 1, failed 2, rejected 1), 4.00 GB moved, 2.000 GB/s, 2 s");
}

TEST(Progress, BarFitsTheWidth) {
  const Progress p = progress_of(sample(), 3'000'000'000);
  const std::string bar = progress_bar(p, 100);
  EXPECT_LE(bar.size(), 100u);
  EXPECT_EQ(bar.find("[" + std::string(26, '#') + std::string(14, '.') + "] 4/6 ok 1 failed 2 rejected 1"), 0u)
      << bar;
  EXPECT_LE(progress_bar(p, 30).size(), 30u);
}

TEST(Progress, FinishedOnlyKeepsWhatAPartialReportMayCount) {
  const ReplayResults f = finished_only(sample());
  ASSERT_EQ(f.requests.size(), 4u);
  EXPECT_EQ(f.requests[3].router_failure, "router: no result within 40 s");
  EXPECT_EQ(f.dispatch_start_ns, 1'000'000'000);
}

}  // namespace
}  // namespace kvferry::replay
