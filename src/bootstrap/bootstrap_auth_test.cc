// The bootstrap service with a cluster secret (docs/security.md): 401 without the bearer token,
// before any route runs (nothing registered); 200 with it; the client sends it.
#include <gtest/gtest.h>
#include <httplib.h>

#include "core/secret.h"
#include "kvferry/bootstrap.h"

namespace kvferry {
namespace {

security::ClusterKeys keys_of(const std::string& secret) {
  auto k = security::derive_keys(secret);
  EXPECT_TRUE(k.ok()) << k.status().str();
  return k.ok() ? *k : security::ClusterKeys{};
}

const security::ClusterKeys kKeys = keys_of("bootstrap auth test secret 0123456789");
const security::ClusterKeys kOther = keys_of("another cluster's secret 0123456789");

PrefillRankInfo rank0() {
  PrefillRankInfo r;
  r.engine_id = 0;
  r.tp_rank = 0;
  r.tp_size = 1;
  r.host = "127.0.0.1";
  r.control_endpoint = "tcp://127.0.0.1:5600";
  r.page_size = 16;
  r.dtype = "bfloat16";
  r.model = "llama3-8b";
  r.num_layers = 32;
  r.heads_per_rank = 8;
  return r;
}

class BootstrapAuth : public ::testing::Test {
 protected:
  void SetUp() override {
    ListenAddress a;
    a.bind_host = "127.0.0.1";
    auto s = BootstrapServer::start(a, &kKeys);
    ASSERT_TRUE(s.ok()) << s.status().str();
    server_ = std::move(s).value();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  httplib::Client raw() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_connection_timeout(std::chrono::seconds(5));
    c.set_read_timeout(std::chrono::seconds(5));
    return c;
  }
  std::unique_ptr<BootstrapServer> server_;
  std::string address_;
};

TEST_F(BootstrapAuth, WithoutTheTokenEveryRouteIs401) {
  auto c = raw();
  for (const char* path : {"/health", "/route?engine_id=0&dp_rank=0&tp_rank=0", "/route?engine_id=0&dp_rank=0",
                           "/nonexistent"}) {
    SCOPED_TRACE(path);
    auto res = c.Get(path);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
  }
  // A registration without the token registers nothing, and neither does one with another
  // cluster's token or a malformed header.
  const std::string body = R"({"engine_id":0,"dp_rank":0,"tp_rank":0})";
  for (const httplib::Headers& h : {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer " + kOther.bearer_token}},
                                    httplib::Headers{{"Authorization", kKeys.bearer_token}}}) {
    auto res = c.Put("/route", h, body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
    auto post = c.Post("/register_dp_rank", h, "{}", "application/json");
    ASSERT_TRUE(post);
    EXPECT_EQ(post->status, 401);
  }
  EXPECT_EQ(server_->registered(), 0u);
}

TEST_F(BootstrapAuth, WithTheToken200) {
  auto c = raw();
  auto res = c.Get("/health", httplib::Headers{{"Authorization", "Bearer " + kKeys.bearer_token}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST_F(BootstrapAuth, ClientWithTheKeysRegistersAndLooksUp) {
  BootstrapClient client(address_, 5000, &kKeys);
  ASSERT_TRUE(client.register_rank(rank0()).ok());
  auto back = client.lookup(0, 0, 0);
  ASSERT_TRUE(back.ok()) << back.status().str();
  EXPECT_EQ(back->control_endpoint, "tcp://127.0.0.1:5600");
  auto n = client.health();
  ASSERT_TRUE(n.ok()) << n.status().str();
  EXPECT_EQ(*n, 1u);
}

TEST_F(BootstrapAuth, ClientWithoutOrWithOtherKeysIsNotAuthorized) {
  for (const security::ClusterKeys* k : {static_cast<const security::ClusterKeys*>(nullptr), &kOther}) {
    BootstrapClient client(address_, 5000, k);
    Status st = client.register_rank(rank0());
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find("not authorized"), std::string::npos) << st.message();
    EXPECT_FALSE(client.lookup(0, 0, 0).ok());
  }
  EXPECT_EQ(server_->registered(), 0u);
}

TEST(BootstrapNoAuth, WithoutKeysNothingIsRequired) {
  ListenAddress a;
  a.bind_host = "127.0.0.1";
  auto s = BootstrapServer::start(a, nullptr);
  ASSERT_TRUE(s.ok()) << s.status().str();
  httplib::Client c("127.0.0.1", (*s)->port());
  auto res = c.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

}  // namespace
}  // namespace kvferry
