// RefusalLog and RateLimit (endpoint/refusals.h): every refusal counted, one warning per kind per
// interval naming the count since the previous one, the rest at debug; a token bucket.
#include "endpoint/refusals.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvferry {
namespace {

struct Line {
  LogLevel level;
  std::string msg;
};

class Capture {
 public:
  Capture() {
    set_log_callback([this](LogLevel l, std::string_view, std::string_view m, const LogFields&) {
      lines.push_back({l, std::string(m)});
    }, LogLevel::kDebug);
  }
  ~Capture() { set_log_callback({}); }
  size_t at(LogLevel l) const {
    size_t n = 0;
    for (const Line& x : lines) n += x.level == l;
    return n;
  }
  std::vector<Line> lines;
};

TEST(RefusalLog, OneWarningPerKindPerIntervalWithTheCountSinceTheLast) {
  Capture cap;
  RefusalLog log("test");
  const int64_t t0 = 1'000'000'000;
  for (int i = 0; i < 100; ++i) log.refuse(Refusal::kOutsidePlan, "outside " + std::to_string(i), {}, t0 + i);
  log.refuse(Refusal::kFutureIncarnation, "future", {}, t0);  // another kind has its own line
  EXPECT_EQ(log.count(Refusal::kOutsidePlan), 100u);
  EXPECT_EQ(log.count(Refusal::kFutureIncarnation), 1u);
  EXPECT_EQ(cap.at(LogLevel::kWarning), 2u);
  // The 99 others: counted, kDebugLinesPerInterval of them at debug (a flood fills no log file).
  EXPECT_EQ(cap.at(LogLevel::kDebug), RefusalLog::kDebugLinesPerInterval);
  EXPECT_EQ(cap.lines.front().msg, "outside 0");
  log.refuse(Refusal::kOutsidePlan, "outside late", {}, t0 + RefusalLog::kLineIntervalNs);
  ASSERT_EQ(cap.at(LogLevel::kWarning), 3u);
  EXPECT_EQ(cap.lines.back().level, LogLevel::kWarning);
  EXPECT_EQ(cap.lines.back().msg, "outside late (100 outside_plan refusals since the last such line)");
  EXPECT_EQ(log.counts()[static_cast<size_t>(Refusal::kOutsidePlan)], 101u);
  // 20 000 quiet refusals over 20 s: at most kDebugLinesPerInterval lines per 10 s window.
  const size_t lines0 = cap.lines.size();
  const int64_t t1 = t0 + 2 * RefusalLog::kLineIntervalNs;
  for (int i = 0; i < 20000; ++i) log.refuse(Refusal::kUnconfirmedRestart, "held", {}, t1 + int64_t(i) * 1'000'000, true);
  EXPECT_EQ(log.count(Refusal::kUnconfirmedRestart), 20000u);
  EXPECT_LE(cap.lines.size() - lines0, 2 * RefusalLog::kDebugLinesPerInterval + 2);
  EXPECT_GE(cap.lines.size() - lines0, 2 * RefusalLog::kDebugLinesPerInterval);
}

TEST(RefusalLog, EveryKindHasAName) {
  for (size_t k = 0; k < kRefusalKinds; ++k) EXPECT_NE(refusal_name(static_cast<Refusal>(k)), "unknown") << k;
}

TEST(RateLimit, BurstThenRefillAtTheRate) {
  RateLimit r(10.0, 3.0);
  const int64_t t0 = 5'000'000'000;
  EXPECT_TRUE(r.take(t0));
  EXPECT_TRUE(r.take(t0));
  EXPECT_TRUE(r.take(t0));
  EXPECT_FALSE(r.take(t0));
  EXPECT_EQ(r.denied(), 1u);
  EXPECT_FALSE(r.take(t0 + 50'000'000));  // half a token
  EXPECT_TRUE(r.take(t0 + 150'000'000));  // a token again (150 ms at 10/s)
  EXPECT_TRUE(r.take(t0 + 10'000'000'000));
  EXPECT_TRUE(r.take(t0 + 10'000'000'000));
  EXPECT_TRUE(r.take(t0 + 10'000'000'000));
  EXPECT_FALSE(r.take(t0 + 10'000'000'000));  // never more than the burst
}

}  // namespace
}  // namespace kvferry
