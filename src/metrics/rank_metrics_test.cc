#include <gtest/gtest.h>
#include <httplib.h>

#include <sstream>
#include <string>

#include "kvferry/metrics.h"

namespace kvferry {
namespace {

// The value of the sample line that starts with `series` (name and labels exactly as written).
double sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  ADD_FAILURE() << "no sample " << series << " in:\n" << text;
  return -1;
}

const std::string kLabels = "rank=\"decode/tp1\",role=\"decode\"";

TEST(RankMetrics, CountersGaugesAndHistogramInTextFormat) {
  RankMetrics m(RankId{Role::kDecode, 0, 1, 0});
  m.room_released(true, 0.004);
  m.room_released(true, 0.2);
  m.room_released(false, -1);
  m.add_verified_bytes(1000, 10);
  m.add_verified_bytes(500, 0);
  m.room_failed(ErrorCode::kTransferError, false);
  m.room_failed(ErrorCode::kTransferError, true);
  m.room_failed(ErrorCode::kTransferError, true);
  m.set_rooms_in_flight({1, 2, 3, 4, 5});
  m.set_leaks(7, 8, 9, 2);
  m.set_quarantined_pages(11);
  m.set_reclaimed_pages(13);
  m.set_pool_residency(1u << 30, 4096, 2);
  m.set_reclaimed_pages(12);  // a counter: never goes back
  const std::string t = m.exposition();
  EXPECT_NE(t.find("# TYPE kvferry_rooms_total counter"), std::string::npos);
  EXPECT_NE(t.find("# TYPE kvferry_transfer_latency_seconds histogram"), std::string::npos);
  EXPECT_EQ(sample(t, "kvferry_rooms_total{" + kLabels + ",outcome=\"success\"}"), 2);
  EXPECT_EQ(sample(t, "kvferry_rooms_total{" + kLabels + ",outcome=\"failed\"}"), 1);
  EXPECT_EQ(sample(t, "kvferry_verified_bytes_total{" + kLabels + "}"), 1500);
  EXPECT_EQ(sample(t, "kvferry_mismatched_bytes_total{" + kLabels + "}"), 10);
  EXPECT_EQ(sample(t, "kvferry_pool_locked_bytes{" + kLabels + "}"), 1 << 30);
  EXPECT_EQ(sample(t, "kvferry_pool_unlocked_bytes{" + kLabels + "}"), 4096);
  EXPECT_EQ(sample(t, "kvferry_pool_residency_warnings_total{" + kLabels + "}"), 2);
  EXPECT_EQ(sample(t, "kvferry_sent_bytes_total{" + kLabels + "}"), 0);
  EXPECT_EQ(sample(t, "kvferry_failures_total{" + kLabels + ",code=\"transfer_error\",origin_kind=\"local\"}"), 1);
  EXPECT_EQ(sample(t, "kvferry_failures_total{" + kLabels + ",code=\"transfer_error\",origin_kind=\"propagated\"}"), 2);
  EXPECT_EQ(sample(t, "kvferry_transfer_latency_seconds_count{" + kLabels + "}"), 2);
  EXPECT_NEAR(sample(t, "kvferry_transfer_latency_seconds_sum{" + kLabels + "}"), 0.204, 1e-9);
  EXPECT_EQ(sample(t, "kvferry_transfer_latency_seconds_bucket{" + kLabels + ",le=\"0.005\"}"), 1);
  EXPECT_EQ(sample(t, "kvferry_transfer_latency_seconds_bucket{" + kLabels + ",le=\"0.25\"}"), 2);
  EXPECT_EQ(sample(t, "kvferry_rooms_in_flight{" + kLabels + ",state=\"Failed\"}"), 1);
  EXPECT_EQ(sample(t, "kvferry_rooms_in_flight{" + kLabels + ",state=\"Success\"}"), 5);
  EXPECT_EQ(sample(t, "kvferry_live_rooms{" + kLabels + "}"), 7);
  EXPECT_EQ(sample(t, "kvferry_registry_records{" + kLabels + "}"), 8);
  EXPECT_EQ(sample(t, "kvferry_pages_in_use{" + kLabels + "}"), 9);
  EXPECT_EQ(sample(t, "kvferry_peer_connections{" + kLabels + "}"), 2);
  EXPECT_EQ(sample(t, "kvferry_quarantined_pages{" + kLabels + "}"), 11);
  EXPECT_NE(t.find("# TYPE kvferry_reclaimed_pages_total counter"), std::string::npos);
  EXPECT_EQ(sample(t, "kvferry_reclaimed_pages_total{" + kLabels + "}"), 13);
}

// Issue 31: every refusal counter on /metrics, by kind, never going back.
TEST(RankMetrics, RefusedFramesByKind) {
  RankMetrics m(RankId{Role::kDecode, 0, 1, 0});
  EXPECT_EQ(m.exposition().find("kvferry_refused_frames_total"), std::string::npos);  // none set yet
  m.set_refusals({{"outside_plan", 64}, {"changed_registration", 2}, {"foreign", 0}});
  m.set_refusals({{"outside_plan", 3}, {"changed_registration", 5}});
  const std::string t = m.exposition();
  EXPECT_NE(t.find("# TYPE kvferry_refused_frames_total counter"), std::string::npos);
  EXPECT_EQ(sample(t, "kvferry_refused_frames_total{" + kLabels + ",kind=\"outside_plan\"}"), 64);
  EXPECT_EQ(sample(t, "kvferry_refused_frames_total{" + kLabels + ",kind=\"changed_registration\"}"), 5);
  EXPECT_EQ(sample(t, "kvferry_refused_frames_total{" + kLabels + ",kind=\"foreign\"}"), 0);
}

TEST(RankMetrics, ControlPlaneCountersAndResidentMemory) {
  RankMetrics m(RankId{Role::kDecode, 0, 1, 0});
  m.set_control_plane({10, 1000, 30, 2000, 7});
  m.set_control_plane({9, 1001, 0, 0, 8});  // a smaller total never lowers a counter
  m.set_process_resident_bytes(4096);
  const std::string t = m.exposition();
  EXPECT_NE(t.find("# TYPE kvferry_control_frames_total counter"), std::string::npos);
  EXPECT_EQ(sample(t, "kvferry_control_frames_total{" + kLabels + ",direction=\"sent\"}"), 10);
  EXPECT_EQ(sample(t, "kvferry_control_frames_total{" + kLabels + ",direction=\"received\"}"), 30);
  EXPECT_EQ(sample(t, "kvferry_control_bytes_total{" + kLabels + ",direction=\"sent\"}"), 1001);
  EXPECT_EQ(sample(t, "kvferry_control_bytes_total{" + kLabels + ",direction=\"received\"}"), 2000);
  EXPECT_EQ(sample(t, "kvferry_heartbeats_sent_total{" + kLabels + "}"), 8);
  EXPECT_EQ(sample(t, "process_resident_memory_bytes{" + kLabels + "}"), 4096);
  EXPECT_GT(process_resident_bytes(), 0u);
}

TEST(RankMetrics, IncarnationCountersNeverGoBack) {
  RankMetrics m(RankId{Role::kDecode, 0, 1, 0});
  m.set_incarnation_counts({1, 2, 3, 4}, 5);
  m.set_incarnation_counts({0, 2, 7, 0}, 1);  // a smaller total never lowers a counter
  const std::string t = m.exposition();
  EXPECT_NE(t.find("# TYPE kvferry_stale_messages_total counter"), std::string::npos);
  EXPECT_EQ(sample(t, "kvferry_stale_messages_total{" + kLabels + ",kind=\"registration\"}"), 1);
  EXPECT_EQ(sample(t, "kvferry_stale_messages_total{" + kLabels + ",kind=\"metadata\"}"), 2);
  EXPECT_EQ(sample(t, "kvferry_stale_messages_total{" + kLabels + ",kind=\"status\"}"), 7);
  EXPECT_EQ(sample(t, "kvferry_stale_messages_total{" + kLabels + ",kind=\"heartbeat\"}"), 4);
  EXPECT_EQ(sample(t, "kvferry_peer_restarts_total{" + kLabels + "}"), 5);
}

TEST(MetricsServer, ServesTheExpositionOverHttp) {
  RankMetrics m(RankId{Role::kPrefill, 0, 0, 0});
  m.add_sent_bytes(4096);
  auto server = MetricsServer::start(m, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().str();
  httplib::Client client("127.0.0.1", (*server)->port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(sample(res->body, "kvferry_sent_bytes_total{rank=\"prefill/tp0\",role=\"prefill\"}"), 4096);
  m.add_sent_bytes(4);
  res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(sample(res->body, "kvferry_sent_bytes_total{rank=\"prefill/tp0\",role=\"prefill\"}"), 4100);
  EXPECT_EQ(client.Get("/other")->status, 404);
  // The port is taken: a second server on it fails with a clear error.
  auto second = MetricsServer::start(m, "127.0.0.1", (*server)->port());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), ErrorCode::kInternal);
}

}  // namespace
}  // namespace kvferry
