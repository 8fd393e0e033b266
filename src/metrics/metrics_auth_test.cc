// MetricsServer with a cluster secret (docs/security.md): a scrape without the bearer token is 401,
// with it 200.
#include <gtest/gtest.h>
#include <httplib.h>

#include "core/secret.h"
#include "kvferry/metrics.h"

namespace kvferry {
namespace {

TEST(MetricsAuth, ScrapeNeedsTheToken) {
  auto keys = security::derive_keys("metrics auth test secret 0123456789");
  ASSERT_TRUE(keys.ok());
  auto other = security::derive_keys("another cluster's secret 0123456789");
  ASSERT_TRUE(other.ok());
  RankMetrics metrics(RankId{Role::kDecode, 0, 1, 0});
  metrics.add_sent_bytes(77);
  auto server = MetricsServer::start(metrics, "127.0.0.1", 0, &*keys);
  ASSERT_TRUE(server.ok()) << server.status().str();
  httplib::Client c("127.0.0.1", (*server)->port());
  c.set_connection_timeout(std::chrono::seconds(5));
  auto anon = c.Get("/metrics");
  ASSERT_TRUE(anon);
  EXPECT_EQ(anon->status, 401);
  EXPECT_EQ(anon->body.find("kvferry_sent_bytes_total"), std::string::npos);
  auto wrong = c.Get("/metrics", httplib::Headers{{"Authorization", "Bearer " + other->bearer_token}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  httplib::Client ok_client("127.0.0.1", (*server)->port());
  ok_client.set_bearer_token_auth(keys->bearer_token);
  auto ok = ok_client.Get("/metrics");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_NE(ok->body.find("kvferry_sent_bytes_total"), std::string::npos);
}

TEST(MetricsAuth, WithoutKeysScrapeIsOpen) {
  RankMetrics metrics(RankId{Role::kDecode, 0, 1, 0});
  auto server = MetricsServer::start(metrics, "127.0.0.1", 0, nullptr);
  ASSERT_TRUE(server.ok()) << server.status().str();
  httplib::Client c("127.0.0.1", (*server)->port());
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

}  // namespace
}  // namespace kvferry
