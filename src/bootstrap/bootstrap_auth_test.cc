// The bootstrap service with a cluster secret (docs/security.md): 401 without a MAC of the request
// under the cluster's key, with the bearer token, a MAC of another request, key, body, method or
// target, a stale timestamp or a used nonce (nothing registered); 200 with it; the client sends it.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "bootstrap/bootstrap_auth_test_util.h"
#include "bootstrap/rank_info_json.h"
#include "core/request_mac.h"
#include "core/secret.h"
#include "kvferry/bootstrap.h"

namespace kvferry {
namespace {

using namespace kvferry::testing;

const security::ClusterKeys kKeys = keys_of("bootstrap auth test secret 0123456789");
const security::ClusterKeys kOther = keys_of("another cluster's secret 0123456789");

PrefillRankInfo rank0() { return test_rank("tcp://127.0.0.1:5600"); }

class BootstrapAuth : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = start_service(&kKeys);
    ASSERT_TRUE(server_);
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

std::string rank0_body() { return bootstrap::dump(bootstrap::rank_info_to_json(rank0())); }

httplib::Headers mac(const std::string& method, const std::string& target, const std::string& body,
                     const security::ClusterKeys& k = kKeys) {
  return {{"Authorization", security::mac_authorization(k, method, target, body)}};
}

TEST_F(BootstrapAuth, WithoutAMacEveryRouteIs401) {
  auto c = raw();
  for (const char* path : {"/health", "/route?engine_id=0&dp_rank=0&tp_rank=0", "/route?engine_id=0&dp_rank=0",
                           "/nonexistent"}) {
    SCOPED_TRACE(path);
    auto res = c.Get(path);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
    EXPECT_EQ(res->get_header_value("WWW-Authenticate"), "KVF-MAC realm=\"kvferry\"");
  }
  // A registration without a MAC registers nothing, and neither does one with the cluster's bearer
  // token (the bootstrap service no longer takes it: a token leaked from /metrics, or sniffed from an
  // older version, gives no access), another cluster's MAC, or a malformed header.
  const std::string body = rank0_body();
  const std::string good = security::mac_authorization(kKeys, "PUT", "/route", body);
  for (const httplib::Headers& h :
       {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer " + kKeys.bearer_token}},
        httplib::Headers{{"Authorization", kKeys.bearer_token}}, mac("PUT", "/route", body, kOther),
        httplib::Headers{{"Authorization", good.substr(0, good.size() - 1)}},
        httplib::Headers{{"Authorization", good + "0"}},
        httplib::Headers{{"Authorization", "KVF-MAC v=2" + good.substr(11)}}}) {
    auto res = c.Put("/route", h, body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
    auto post = c.Post("/register_dp_rank", h, R"({"bootstrap_room":5,"dp_rank":0})", "application/json");
    ASSERT_TRUE(post);
    EXPECT_EQ(post->status, 401);
  }
  EXPECT_EQ(server_->registered(), 0u);
}

TEST_F(BootstrapAuth, AValidMacIsAcceptedOnceForItsOwnRequestOnly) {
  auto c = raw();
  const std::string body = rank0_body();
  const httplib::Headers put = mac("PUT", "/route", body);
  // Another body, method or target under this MAC: refused, nothing registered.
  std::string other_body = body;
  other_body.replace(other_body.find("5600"), 4, "6666");
  auto altered = c.Put("/route", put, other_body, "application/json");
  ASSERT_TRUE(altered);
  EXPECT_EQ(altered->status, 401);
  auto as_get = c.Get("/route?engine_id=0&dp_rank=0", put);
  ASSERT_TRUE(as_get);
  EXPECT_EQ(as_get->status, 401);
  auto as_query = c.Put("/route?x=1", put, body, "application/json");
  ASSERT_TRUE(as_query);
  EXPECT_EQ(as_query->status, 401);
  EXPECT_EQ(server_->registered(), 0u);
  // Its own request: 200, once.
  auto ok = c.Put("/route", put, body, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(server_->registered(), 1u);
  auto again = c.Put("/route", put, body, "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 401);
  EXPECT_NE(again->body.find("nonce already used"), std::string::npos) << again->body;
  // A lookup's MAC covers its query string.
  const std::string target = "/route?engine_id=0&dp_rank=0&tp_rank=0";
  const httplib::Headers get = mac("GET", target, "");
  auto other_rank = c.Get("/route?engine_id=0&dp_rank=0&tp_rank=1", get);
  ASSERT_TRUE(other_rank);
  EXPECT_EQ(other_rank->status, 401);
  auto found = c.Get(target, get);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->status, 200) << found->body;
  EXPECT_NE(found->body.find("tcp://127.0.0.1:5600"), std::string::npos);
}

TEST_F(BootstrapAuth, AStaleTimestampIs401BeforeTheBodyIsRead) {
  auto c = raw();
  security::Nonce n{};
  n[0] = 1;
  const std::string body = rank0_body();
  for (int64_t skew : {-security::kMacWindowS - 30, security::kMacWindowS + 30}) {
    SCOPED_TRACE(skew);
    const std::string h = security::mac_authorization(kKeys, "PUT", "/route", body, security::unix_now_s() + skew, n);
    auto res = c.Put("/route", httplib::Headers{{"Authorization", h}}, body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
    EXPECT_NE(res->body.find("clocks"), std::string::npos) << res->body;
  }
  EXPECT_EQ(server_->registered(), 0u);
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
    EXPECT_NE(st.message().find(k ? "not this cluster's" : "no KVF-MAC"), std::string::npos) << st.message();
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
