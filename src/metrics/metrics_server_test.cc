// MetricsServer's bind host (kvferry/net.h): IPv6 loopback, a host name, wildcards, bad hosts.
#include <gtest/gtest.h>
#include <httplib.h>

#include <string>

#include "kvferry/metrics.h"
#include "kvferry/net.h"

namespace kvferry {
namespace {

const std::string kSample = "kvferry_sent_bytes_total{rank=\"decode/tp1\",role=\"decode\"} 77";

// GET /metrics from host:port; the body, or "" when nothing answered.
std::string scrape(const std::string& host, uint16_t port) {
  httplib::Client client(host, port);
  client.set_connection_timeout(std::chrono::seconds(2));
  auto res = client.Get("/metrics");
  return res && res->status == 200 ? res->body : "";
}

class MetricsServerHost : public ::testing::Test {
 protected:
  MetricsServerHost() : metrics_(RankId{Role::kDecode, 0, 1, 0}) { metrics_.add_sent_bytes(77); }
  RankMetrics metrics_;
};

TEST_F(MetricsServerHost, Ipv6Loopback) {
  auto server = MetricsServer::start(metrics_, "::1", 0);
  ASSERT_TRUE(server.ok()) << server.status().str();
  EXPECT_NE(scrape("::1", (*server)->port()).find(kSample), std::string::npos);
  auto bracketed = MetricsServer::start(metrics_, "[::1]", 0);
  ASSERT_TRUE(bracketed.ok()) << bracketed.status().str();
  EXPECT_NE(scrape("::1", (*bracketed)->port()).find(kSample), std::string::npos);
}

TEST_F(MetricsServerHost, HostName) {
  auto server = MetricsServer::start(metrics_, "localhost", 0);
  ASSERT_TRUE(server.ok()) << server.status().str();
  EXPECT_NE(scrape("localhost", (*server)->port()).find(kSample), std::string::npos);
}

TEST_F(MetricsServerHost, WildcardsListenEverywhere) {
  for (const char* host : {"*", "::"}) {
    auto server = MetricsServer::start(metrics_, host, 0);
    ASSERT_TRUE(server.ok()) << host << ": " << server.status().str();
    EXPECT_NE(scrape("127.0.0.1", (*server)->port()).find(kSample), std::string::npos) << host;
    EXPECT_NE(scrape("::1", (*server)->port()).find(kSample), std::string::npos) << host;
  }
  auto v4 = MetricsServer::start(metrics_, "0.0.0.0", 0);
  ASSERT_TRUE(v4.ok()) << v4.status().str();
  EXPECT_NE(scrape("127.0.0.1", (*v4)->port()).find(kSample), std::string::npos);
}

TEST_F(MetricsServerHost, BadHosts) {
  for (const char* host : {"bad host", "[10.0.0.1]", "::g"}) {
    auto server = MetricsServer::start(metrics_, host, 0);
    ASSERT_FALSE(server.ok()) << host;
    EXPECT_EQ(server.status().code(), ErrorCode::kInvalidArgument) << server.status().str();
  }
  auto not_local = MetricsServer::start(metrics_, "192.0.2.1", 0);  // TEST-NET-1: no interface has it
  ASSERT_FALSE(not_local.ok());
  EXPECT_EQ(not_local.status().code(), ErrorCode::kInternal);
  EXPECT_NE(not_local.status().message().find("192.0.2.1"), std::string::npos) << not_local.status().str();
}

}  // namespace
}  // namespace kvferry
