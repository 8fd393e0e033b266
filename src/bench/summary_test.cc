#include "bench/summary.h"

#include <gtest/gtest.h>

namespace kvferry::bench {
namespace {

TEST(Quantile, NearestRank) {
  EXPECT_EQ(quantile({}, 0.5), 0);
  EXPECT_EQ(quantile({7}, 0.99), 7);
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(quantile(v, 0.5), 50);
  EXPECT_EQ(quantile(v, 0.9), 90);
  EXPECT_EQ(quantile(v, 0.99), 99);
  EXPECT_EQ(quantile(v, 1.0), 100);
  EXPECT_EQ(quantile(v, 0.0), 1);
}

nlohmann::json rank(const std::string& name, const std::string& role, double cpu, nlohmann::json rooms) {
  nlohmann::json rss = {{"rss_kib", 10}, {"anon_kib", 5}, {"shmem_kib", 5}};
  return {{"name", name}, {"role", role}, {"cpu_s", cpu}, {"failed", 0}, {"open_at_exit", 0},
          {"rooms_total", rooms.size()}, {"rooms_before_window", 0}, {"rss_start", rss}, {"rss_end", rss},
          {"pool_bytes", 1}, {"rooms", rooms}};
}

TEST(CdfPoints, EvenlySpacedInRankWithBothEnds) {
  std::vector<double> v;
  for (int i = 1000; i >= 1; --i) v.push_back(i);
  auto p = cdf_points(v, 5);
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0], 1);
  EXPECT_EQ(p[4], 1000);
  EXPECT_EQ(p[2], 500);  // rank 999 * 2 / 4 = 499 -> value 500
  EXPECT_EQ(cdf_points({3, 1}, 10), nlohmann::json({1, 3}));
  EXPECT_TRUE(cdf_points({}, 10).empty());
}

TEST(Summarize, RoomsCountOnlyWhenEveryPrefillRankFinishedThem) {
  // Two prefill ranks: room 1 done by both (sends at 1 ms and 2 ms, done at 5 ms and 9 ms),
  // room 2 only by tp0 (its Success on tp1 fell outside the window).
  std::vector<nlohmann::json> ranks = {
      rank("prefill-tp0", "prefill", 0.5, {{1, 1'000'000, 5'000'000, 1000}, {2, 1'000'000, 2'000'000, 1000}}),
      rank("prefill-tp1", "prefill", 0.25, {{1, 2'000'000, 9'000'000, 3000}}),
      rank("decode-tp0", "decode", 0.25, {{1, 0, 10'000'000, 0}}),
  };
  nlohmann::json j = summarize(ranks, 2, 1, 2.0);
  EXPECT_EQ(j["rooms"], 1);
  EXPECT_EQ(j["bytes"], 4000);
  EXPECT_DOUBLE_EQ(j["gb_per_s"].get<double>(), 4000 / 1e9 / 2.0);
  EXPECT_DOUBLE_EQ(j["rooms_per_s"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["transfer_latency_ms"]["p50"].get<double>(), 8.0);  // 9 ms - 1 ms
  EXPECT_DOUBLE_EQ(j["room_latency_ms"]["p99"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["cpu_s"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["cpu_s_per_gb"].get<double>(), 1.0 / (4000 / 1e9));
  EXPECT_DOUBLE_EQ(j["cpu_us_per_room"].get<double>(), 1e6);
  EXPECT_EQ(j["ranks"].size(), 3u);
}

TEST(Summarize, NothingFinishedIsZeroNotNan) {
  nlohmann::json j = summarize({rank("prefill-tp0", "prefill", 0.1, nlohmann::json::array())}, 1, 1, 1.0);
  EXPECT_EQ(j["rooms"], 0);
  EXPECT_EQ(j["gb_per_s"].get<double>(), 0.0);
  EXPECT_EQ(j["cpu_s_per_gb"].get<double>(), 0.0);
  EXPECT_EQ(j["transfer_latency_ms"]["p99"].get<double>(), 0.0);
}

}  // namespace
}  // namespace kvferry::bench
