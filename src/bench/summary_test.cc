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

TEST(BytesInWindow, EvenRateOverTheInterval) {
  const Window w{10'000, 20'000};
  EXPECT_DOUBLE_EQ(bytes_in_window(400, 12'000, 14'000, w), 400);  // inside
  EXPECT_DOUBLE_EQ(bytes_in_window(400, 8'000, 12'000, w), 200);   // straddles the start
  EXPECT_DOUBLE_EQ(bytes_in_window(400, 18'000, 22'000, w), 200);  // straddles the end
  EXPECT_DOUBLE_EQ(bytes_in_window(400, 5'000, 25'000, w), 200);   // covers the window
  EXPECT_DOUBLE_EQ(bytes_in_window(400, 2'000, 10'000, w), 0);     // ends where the window starts
  EXPECT_DOUBLE_EQ(bytes_in_window(400, 20'000, 21'000, w), 0);    // starts where it ends
  // A zero-length interval counts whole at its instant, if that is in [start, end).
  EXPECT_DOUBLE_EQ(bytes_in_window(400, 10'000, 10'000, w), 400);
  EXPECT_DOUBLE_EQ(bytes_in_window(400, 20'000, 20'000, w), 0);
}

TEST(Summarize, RoomsAtTheEdgesCountWithTheirShareOfTheWindow) {
  // Window [10 s, 20 s), one prefill rank. Rows are [room, first send ns, Success ns, bytes].
  std::vector<nlohmann::json> ranks = {
      rank("prefill-tp0", "prefill", 2.0,
           {{1, 8'000'000'000, 12'000'000'000, 4'000'000'000},    // half inside: 2 GB, completes inside
            {2, 12'000'000'000, 14'000'000'000, 3'000'000'000},   // inside: 3 GB
            {3, 18'000'000'000, 22'000'000'000, 4'000'000'000},   // half inside: 2 GB, completes after
            {4, 2'000'000'000, 9'000'000'000, 5'000'000'000},     // before: 0
            {5, 20'000'000'000, 21'000'000'000, 5'000'000'000},   // after: 0
            {6, 5'000'000'000, 25'000'000'000, 2'000'000'000}}),  // covers it: 1 GB
      rank("decode-tp0", "decode", 1.0,
           {{1, 7'000'000'000, 12'500'000'000, 0}, {2, 11'000'000'000, 14'500'000'000, 0},
            {3, 17'000'000'000, 22'500'000'000, 0}}),
  };
  auto s = summarize(ranks, 1, 1, Window{10'000'000'000, 20'000'000'000});
  ASSERT_TRUE(s.ok()) << s.status().str();
  const nlohmann::json& j = *s;
  EXPECT_DOUBLE_EQ(j["window_s"].get<double>(), 10.0);
  EXPECT_EQ(j["bytes"], 8'000'000'000u);  // 2 + 3 + 2 + 1 GB
  EXPECT_DOUBLE_EQ(j["gb_per_s"].get<double>(), 0.8);
  // Whole rooms completed inside: 1 and 2 (whole rooms alone would have said 0.7 GB/s).
  EXPECT_EQ(j["rooms"], 2);
  EXPECT_EQ(j["completed_bytes"], 7'000'000'000u);
  EXPECT_DOUBLE_EQ(j["rooms_per_s"].get<double>(), 0.2);
  EXPECT_EQ(j["transfer_latency_ms"]["count"], 2);
  EXPECT_DOUBLE_EQ(j["transfer_latency_ms"]["p50"].get<double>(), 2000.0);  // room 2
  EXPECT_DOUBLE_EQ(j["transfer_latency_ms"]["max"].get<double>(), 4000.0);  // room 1
  EXPECT_EQ(j["room_latency_ms"]["count"], 2);
  EXPECT_DOUBLE_EQ(j["room_latency_ms"]["max"].get<double>(), 5500.0);  // room 1
  EXPECT_DOUBLE_EQ(j["cpu_s_per_gb"].get<double>(), 3.0 / 8.0);
  EXPECT_DOUBLE_EQ(j["cpu_us_per_room"].get<double>(), 1.5e6);
}

TEST(Summarize, EachPrefillRankCountsItsOwnInterval) {
  // Two prefill ranks, window [10 s, 20 s). Room 1: tp0 moves 2 GB over [9 s, 11 s] (1 GB inside),
  // tp1 4 GB over [9 s, 13 s] (3 GB inside). Room 2: tp0 is done before the window (0 inside), tp1
  // moves 4 GB over [7 s, 11 s] (1 GB inside); its last Success is inside, so it completed inside.
  std::vector<nlohmann::json> ranks = {
      rank("prefill-tp0", "prefill", 0.5,
           {{1, 9'000'000'000, 11'000'000'000, 2'000'000'000}, {2, 7'000'000'000, 8'000'000'000, 1'000'000'000}}),
      rank("prefill-tp1", "prefill", 0.5,
           {{1, 9'000'000'000, 13'000'000'000, 4'000'000'000}, {2, 7'000'000'000, 11'000'000'000, 4'000'000'000}}),
  };
  auto s = summarize(ranks, 2, 1, Window{10'000'000'000, 20'000'000'000});
  ASSERT_TRUE(s.ok()) << s.status().str();
  const nlohmann::json& j = *s;
  EXPECT_EQ(j["bytes"], 5'000'000'000u);
  EXPECT_DOUBLE_EQ(j["gb_per_s"].get<double>(), 0.5);
  EXPECT_EQ(j["rooms"], 2);
  EXPECT_EQ(j["completed_bytes"], 11'000'000'000u);
  EXPECT_DOUBLE_EQ(j["transfer_latency_ms"]["p50"].get<double>(), 4000.0);
  EXPECT_DOUBLE_EQ(j["transfer_latency_ms"]["max"].get<double>(), 4000.0);
  EXPECT_EQ(j["room_latency_ms"]["count"], 0);  // no decode rank reported
}

TEST(Summarize, RoomsCountOnlyWhenEveryPrefillRankFinishedThem) {
  // Two prefill ranks: room 1 done by both (sends at 1 ms and 2 ms, done at 5 ms and 9 ms),
  // room 2 only by tp0 (tp1 never finished it): its bytes on tp0 moved, but it is no room done.
  std::vector<nlohmann::json> ranks = {
      rank("prefill-tp0", "prefill", 0.5, {{1, 1'000'000, 5'000'000, 1000}, {2, 1'000'000, 2'000'000, 1000}}),
      rank("prefill-tp1", "prefill", 0.25, {{1, 2'000'000, 9'000'000, 3000}}),
      rank("decode-tp0", "decode", 0.25, {{1, 0, 10'000'000, 0}}),
  };
  auto s = summarize(ranks, 2, 1, Window{0, 2'000'000'000});
  ASSERT_TRUE(s.ok()) << s.status().str();
  const nlohmann::json& j = *s;
  EXPECT_EQ(j["rooms"], 1);
  EXPECT_EQ(j["completed_bytes"], 4000);
  EXPECT_EQ(j["bytes"], 5000);
  EXPECT_DOUBLE_EQ(j["gb_per_s"].get<double>(), 5000 / 1e9 / 2.0);
  EXPECT_DOUBLE_EQ(j["rooms_per_s"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["transfer_latency_ms"]["p50"].get<double>(), 8.0);  // 9 ms - 1 ms
  EXPECT_DOUBLE_EQ(j["room_latency_ms"]["p99"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["cpu_s"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["cpu_s_per_gb"].get<double>(), 1.0 / (5000 / 1e9));
  EXPECT_DOUBLE_EQ(j["cpu_us_per_room"].get<double>(), 1e6);
  EXPECT_EQ(j["ranks"].size(), 3u);
}

TEST(Summarize, RoomsEntirelyOutsideTheWindowCountNothing) {
  std::vector<nlohmann::json> ranks = {
      rank("prefill-tp0", "prefill", 0.1,
           {{1, 1'000, 5'000, 700}, {2, 5'000, 9'999, 700}, {3, 20'000, 30'000, 700}, {4, 25'000, 25'000, 700}})};
  auto s = summarize(ranks, 1, 1, Window{10'000, 20'000});
  ASSERT_TRUE(s.ok()) << s.status().str();
  EXPECT_EQ((*s)["rooms"], 0);
  EXPECT_EQ((*s)["bytes"], 0);
  EXPECT_EQ((*s)["gb_per_s"].get<double>(), 0.0);
  EXPECT_EQ((*s)["cpu_s_per_gb"].get<double>(), 0.0);
}

TEST(Summarize, NothingFinishedIsZeroNotNan) {
  auto s = summarize({rank("prefill-tp0", "prefill", 0.1, nlohmann::json::array())}, 1, 1, Window{0, 1'000'000'000});
  ASSERT_TRUE(s.ok()) << s.status().str();
  const nlohmann::json& j = *s;
  EXPECT_EQ(j["rooms"], 0);
  EXPECT_EQ(j["gb_per_s"].get<double>(), 0.0);
  EXPECT_EQ(j["cpu_s_per_gb"].get<double>(), 0.0);
  EXPECT_EQ(j["transfer_latency_ms"]["p99"].get<double>(), 0.0);
}

TEST(Summarize, TransferTailRunsFromTheLastLayersComputeToTheLastDecodeSuccess) {
  // Two prefill ranks with the compute model (fifth column: end of the last layer's compute), two
  // decode ranks. Room 1: compute ends at 4 ms (tp0) and 5 ms (tp1), decode Success at 6 ms and
  // 7 ms: tail 2 ms. Room 2: 10 ms / 10 ms, decode 13 ms / 11 ms: tail 3 ms. Room 3 only one
  // decode rank finished: no tail.
  std::vector<nlohmann::json> ranks = {
      rank("prefill-tp0", "prefill", 0.1,
           {{1, 1'000'000, 5'500'000, 10, 4'000'000}, {2, 8'000'000, 10'500'000, 10, 10'000'000},
            {3, 12'000'000, 15'000'000, 10, 14'000'000}}),
      rank("prefill-tp1", "prefill", 0.1,
           {{1, 1'000'000, 5'600'000, 10, 5'000'000}, {2, 8'000'000, 10'600'000, 10, 10'000'000},
            {3, 12'000'000, 15'000'000, 10, 14'000'000}}),
      rank("decode-tp0", "decode", 0.1, {{1, 0, 6'000'000, 0}, {2, 0, 13'000'000, 0}, {3, 0, 16'000'000, 0}}),
      rank("decode-tp1", "decode", 0.1, {{1, 0, 7'000'000, 0}, {2, 0, 11'000'000, 0}}),
  };
  auto s = summarize(ranks, 2, 2, Window{0, 1'000'000'000});
  ASSERT_TRUE(s.ok()) << s.status().str();
  const nlohmann::json& j = *s;
  ASSERT_TRUE(j.contains("transfer_tail_ms"));
  EXPECT_EQ(j["transfer_tail_ms"]["count"], 2);
  EXPECT_DOUBLE_EQ(j["transfer_tail_ms"]["p50"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["transfer_tail_ms"]["max"].get<double>(), 3.0);
  EXPECT_EQ(j["transfer_tail_cdf_ms"].size(), 2u);
  // Without the compute model (four columns, or a zero fifth) there is no tail.
  auto plain = summarize({rank("prefill-tp0", "prefill", 0.1, {{1, 0, 10, 100, 0}}),
                          rank("decode-tp0", "decode", 0.1, {{1, 0, 20, 0}})},
                         1, 1, Window{0, 1'000});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->contains("transfer_tail_ms"));
}

TEST(Summarize, EmptyWindowIsRefused) {
  std::vector<nlohmann::json> ranks = {rank("prefill-tp0", "prefill", 0.1, {{1, 0, 10, 100}})};
  for (Window w : {Window{5, 5}, Window{6, 5}}) {
    auto s = summarize(ranks, 1, 1, w);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace kvferry::bench

namespace kvferry::bench {
namespace {

TEST(Summarize, PageFaultsPerGbPerRankAndTheWorst) {
  // 4 GB moved inside [10 s, 20 s): prefill faulted 400 + 4 times, decode 8 times.
  nlohmann::json p = rank("prefill-tp0", "prefill", 1.0, {{1, 12'000'000'000, 14'000'000'000, 4'000'000'000}});
  p["minor_faults"] = 400;
  p["major_faults"] = 4;
  nlohmann::json d = rank("decode-tp0", "decode", 1.0, {{1, 11'000'000'000, 14'000'000'000, 4'000'000'000}});
  d["minor_faults"] = 8;
  d["major_faults"] = 0;
  auto j = summarize({p, d}, 1, 1, Window{10'000'000'000, 20'000'000'000});
  ASSERT_TRUE(j.ok()) << j.status().str();
  EXPECT_DOUBLE_EQ((*j)["ranks"][0]["faults_per_gb"].get<double>(), 101.0);
  EXPECT_DOUBLE_EQ((*j)["ranks"][1]["faults_per_gb"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ((*j)["faults_per_gb"].get<double>(), 101.0);
  EXPECT_EQ((*j)["ranks"][0]["minor_faults"].get<uint64_t>(), 400u);
}

}  // namespace
}  // namespace kvferry::bench

namespace kvferry::bench {
namespace {

TEST(Summarize, WritesPerSecondAndCpuPerWrite) {
  nlohmann::json p = rank("prefill-tp0", "prefill", 3.0, {{1, 12'000'000'000, 14'000'000'000, 1'000'000'000}});
  p["writes"] = 1'000'000;
  nlohmann::json d = rank("decode-tp0", "decode", 1.0, {{1, 11'000'000'000, 14'000'000'000, 1'000'000'000}});
  d["writes"] = 0;
  auto j = summarize({p, d}, 1, 1, Window{10'000'000'000, 20'000'000'000});
  ASSERT_TRUE(j.ok()) << j.status().str();
  EXPECT_EQ((*j)["writes"].get<uint64_t>(), 1'000'000u);
  EXPECT_DOUBLE_EQ((*j)["writes_per_s"].get<double>(), 100'000.0);
  EXPECT_DOUBLE_EQ((*j)["cpu_ns_per_write"].get<double>(), 4000.0);  // 4 CPU s / 10^6 writes
}

}  // namespace
}  // namespace kvferry::bench
