// The root-cause rule (kvferry/error.h failure_precedes / root_cause): ties, reversed arrival
// orders, skewed clocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kvferry/error.h"

namespace kvferry {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kWall = 1'764'000'000'000'000'000;  // some 2025 wall-clock instant, ns

Failure fail(Role role, uint32_t tp, ErrorCode code, int64_t mono, int64_t wall = 0) {
  return Failure{code, RankId{role, 0, tp, 0}, "r", mono, wall};
}

TEST(FailureRule, EarliestWinsAcrossSkewWindows) {
  auto a = fail(Role::kDecode, 1, ErrorCode::kWaitingTimeout, 100 * kMs);
  auto b = fail(Role::kDecode, 0, ErrorCode::kWaitingTimeout, 120 * kMs);
  EXPECT_TRUE(failure_precedes(a, b));
  EXPECT_FALSE(failure_precedes(b, a));
  EXPECT_EQ(root_cause({b, a})->origin.str(), "decode/tp1");
}

TEST(FailureRule, TiesGoToTheFixedRankOrder) {
  // Same instant: prefill before decode, then lower tp.
  auto d0 = fail(Role::kDecode, 0, ErrorCode::kTransferError, 100 * kMs);
  auto d1 = fail(Role::kDecode, 1, ErrorCode::kTransferError, 100 * kMs);
  auto p1 = fail(Role::kPrefill, 1, ErrorCode::kTransferError, 100 * kMs);
  EXPECT_EQ(root_cause({d1, d0})->origin.str(), "decode/tp0");
  EXPECT_EQ(root_cause({d1, d0, p1})->origin.str(), "prefill/tp1");
  // Within one skew window the clock does not decide: decode/tp0 a little later still wins.
  auto d0_later = fail(Role::kDecode, 0, ErrorCode::kTransferError, 100 * kMs + kFailureSkewWindowNs / 2 - 1);
  auto d1_first = fail(Role::kDecode, 1, ErrorCode::kTransferError, 100 * kMs);
  EXPECT_EQ(root_cause({d1_first, d0_later})->origin.str(), "decode/tp0");
  // dp and engine come before tp.
  Failure dp1{ErrorCode::kTransferError, RankId{Role::kDecode, 0, 0, 1}, "r", 100 * kMs, 0};
  Failure e1{ErrorCode::kTransferError, RankId{Role::kDecode, 1, 0, 0}, "r", 100 * kMs, 0};
  EXPECT_EQ(root_cause({dp1, d1})->origin.str(), "decode/tp1");
  EXPECT_EQ(root_cause({e1, dp1})->origin.str(), "decode/tp0/dp1");
}

TEST(FailureRule, ACauseBeatsATimeoutInTheSameWindow) {
  auto timeout = fail(Role::kPrefill, 0, ErrorCode::kBootstrapTimeout, 100 * kMs);
  auto injected = fail(Role::kDecode, 1, ErrorCode::kInjected, 101 * kMs);
  EXPECT_EQ(root_cause({timeout, injected})->origin.str(), "decode/tp1");
  // A window apart, the earlier timeout wins.
  auto late = fail(Role::kDecode, 1, ErrorCode::kInjected, 100 * kMs + 2 * kFailureSkewWindowNs);
  EXPECT_EQ(root_cause({late, timeout})->origin.str(), "prefill/tp0");
}

TEST(FailureRule, IsAStrictTotalOrder) {
  std::vector<Failure> all;
  for (int role = 0; role < 2; ++role)
    for (uint32_t tp = 0; tp < 3; ++tp)
      for (ErrorCode c : {ErrorCode::kWaitingTimeout, ErrorCode::kTransferError})
        for (int64_t t : {int64_t{0}, kMs, 7 * kMs, 11 * kMs}) all.push_back(fail(Role(role), tp, c, t));
  for (const Failure& a : all) {
    EXPECT_FALSE(failure_precedes(a, a));
    for (const Failure& b : all) {
      if (a == b) continue;
      EXPECT_NE(failure_precedes(a, b), failure_precedes(b, a)) << a.describe() << " vs " << b.describe();
      if (!failure_precedes(a, b)) continue;
      for (const Failure& c : all) {
        if (failure_precedes(b, c)) {
          EXPECT_TRUE(failure_precedes(a, c));
        }
      }
    }
  }
}

TEST(FailureRule, WinnerIsAFunctionOfTheSetNotOfArrivalOrder) {
  std::vector<Failure> set = {
      fail(Role::kDecode, 0, ErrorCode::kWaitingTimeout, 400 * kMs + 300'000),
      fail(Role::kDecode, 1, ErrorCode::kWaitingTimeout, 400 * kMs + 100'000),
      fail(Role::kPrefill, 0, ErrorCode::kTransferError, 409 * kMs),
      fail(Role::kPrefill, 1, ErrorCode::kTransferError, 408 * kMs),
  };
  std::sort(set.begin(), set.end(), [](const Failure& a, const Failure& b) { return a.first_seen_ns < b.first_seen_ns; });
  const Failure expected = *root_cause(set);
  EXPECT_EQ(expected.origin.str(), "decode/tp0");  // same window as decode/tp1; tp0 first
  int perms = 0;
  do {
    EXPECT_EQ(*root_cause(set), expected);
    // Two ranks each know a part (any split); the engine's MIN over their winners is the same.
    for (size_t k = 1; k < set.size(); ++k) {
      std::vector<Failure> a(set.begin(), set.begin() + k), b(set.begin() + k, set.end());
      EXPECT_EQ(*root_cause({*root_cause(a), *root_cause(b)}), expected);
    }
    ++perms;
  } while (std::next_permutation(set.begin(), set.end(), [](const Failure& a, const Failure& b) {
    return a.first_seen_ns < b.first_seen_ns;
  }));
  EXPECT_EQ(perms, 24);
}

TEST(FailureRule, SkewedClocksCompareTheOriginsWallClocks) {
  // Two hosts: their monotonic clocks are unrelated (one booted a day earlier), wall clocks agree
  // within a millisecond. The rule uses wall_ns when both records carry it.
  const int64_t day = 86'400'000 * kMs;
  auto p = fail(Role::kPrefill, 0, ErrorCode::kTransferError, day + 5 * kMs, kWall + 30 * kMs);
  auto d = fail(Role::kDecode, 0, ErrorCode::kTransferError, 7 * kMs, kWall + 10 * kMs);
  EXPECT_EQ(root_cause({p, d})->origin.str(), "decode/tp0");  // earlier by wall clock
  // Skew within the window: a decode clock 2 ms behind makes its later failure look earlier; the
  // window puts both in one bucket, so the fixed order decides, whatever each clock says.
  auto p2 = fail(Role::kPrefill, 1, ErrorCode::kTransferError, 1, kWall + 100 * kMs + 1 * kMs);
  auto d2 = fail(Role::kDecode, 1, ErrorCode::kTransferError, 2, kWall + 100 * kMs);
  EXPECT_EQ(root_cause({d2, p2})->origin.str(), "prefill/tp1");
  // A record without wall_ns (an older peer) is compared by first_seen_ns.
  auto old = fail(Role::kDecode, 2, ErrorCode::kTransferError, 3 * kMs, 0);
  EXPECT_TRUE(failure_precedes(old, p));
}

TEST(FailureRecord, DescribeAndKVTransferErrorRoundTrip) {
  Failure f{ErrorCode::kTransferError, RankId{Role::kPrefill, 0, 1, 0}, "write failed", 10, 20};
  EXPECT_EQ(f.describe(), "transfer_error at prefill/tp1: write failed");
  KVTransferError e = KVTransferError::from(42, f, true);
  EXPECT_EQ(e.bootstrap_room, 42u);
  EXPECT_TRUE(e.is_from_another_rank);
  EXPECT_EQ(e.failure(), f);
  EXPECT_EQ(e.str(), "room 42: transfer_error at prefill/tp1 (from another rank): write failed");
}

TEST(FailureRecord, WallFromMonotonicIsTheSameInstant) {
  const int64_t mono = monotonic_ns() - 50 * kMs;
  const int64_t wall = wall_from_monotonic(mono);
  const int64_t now = realtime_ns();
  EXPECT_GE(now - wall, 50 * kMs);
  EXPECT_LT(now - wall, 50 * kMs + 1000 * kMs);  // a generous bound for a loaded machine
}

}  // namespace
}  // namespace kvferry
