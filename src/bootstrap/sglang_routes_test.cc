// SGLang's bootstrap routes on kvferry's bootstrap service (bootstrap/sglang_routes.h).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "bootstrap/sglang_routes.h"
#include "kvferry/bootstrap.h"

namespace kvferry {
namespace {

nlohmann::json rank_body(int tp, int port) {
  return {{"attn_tp_size", 2},  {"attn_tp_rank", tp},     {"attn_cp_size", 1},   {"attn_cp_rank", 0},
          {"attn_dp_size", 1},  {"attn_dp_rank", 0},      {"pp_size", 1},        {"pp_rank", 0},
          {"system_dp_size", 1}, {"system_dp_rank", 0},   {"rank_ip", "10.0.0.5"}, {"rank_port", port},
          {"page_size", 16},    {"kv_cache_dtype", "auto"}, {"load_balance_method", "follow_bootstrap_room"},
          {"prefill_http_port", 30000}};
}

class SglangRoutes : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = BootstrapServer::start("127.0.0.1", 0);
    ASSERT_TRUE(s.ok()) << s.status().str();
    server_ = std::move(s).value();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
  }
  httplib::Result put(const nlohmann::json& j) { return client_->Put("/route", j.dump(), "application/json"); }
  httplib::Result get(const std::string& q) { return client_->Get("/route?" + q); }
  std::unique_ptr<BootstrapServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(SglangRoutes, RegisterThenLookUpRanksAndParallelInfo) {
  auto r = put(rank_body(0, 7000));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "OK");
  // One of two ranks registered: not ready yet.
  r = get("prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  ASSERT_EQ(put(rank_body(1, 7001))->status, 200);
  r = get("prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1");
  ASSERT_EQ(r->status, 200);
  auto info = nlohmann::json::parse(r->body);
  EXPECT_EQ(info["attn_tp_size"], 2);
  EXPECT_EQ(info["attn_cp_size"], 1);
  EXPECT_EQ(info["dp_size"], 1);
  EXPECT_EQ(info["pp_size"], 1);
  EXPECT_EQ(info["page_size"], 16);
  EXPECT_EQ(info["kv_cache_dtype"], "auto");
  EXPECT_EQ(info["follow_bootstrap_room"], true);
  EXPECT_EQ(info["enable_dsa_cache_layer_split"], false);
  EXPECT_EQ(info["prefill_http_port"], 30000);
  r = get("prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0");
  ASSERT_EQ(r->status, 200);
  auto one = nlohmann::json::parse(r->body);
  EXPECT_EQ(one["rank_ip"], "10.0.0.5");
  EXPECT_EQ(one["rank_port"], 7001);
  EXPECT_EQ(get("prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=3")->status, 404);
  EXPECT_EQ(get("prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0")->status, 400);
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

TEST_F(SglangRoutes, RefusesMalformedAndInconsistentRegistrations) {
  auto bad = rank_body(2, 7000);  // rank outside its size
  EXPECT_EQ(put(bad)->status, 400);
  bad = rank_body(0, 0);
  EXPECT_EQ(put(bad)->status, 400);
  bad = rank_body(0, 7000);
  bad["rank_ip"] = "0.0.0.0";  // a wildcard is no address
  EXPECT_EQ(put(bad)->status, 400);
  bad = rank_body(0, 7000);
  bad["attn_tp_size"] = "two";
  EXPECT_EQ(put(bad)->status, 400);
  bad = rank_body(0, 7000);
  bad["attn_tp_size"] = 1024;
  bad["pp_size"] = 1024;  // 1M ranks: beyond the table's bound
  bad["attn_tp_rank"] = 0;
  EXPECT_EQ(put(bad)->status, 400);
  ASSERT_EQ(put(rank_body(0, 7000))->status, 200);
  auto other = rank_body(1, 7001);
  other["page_size"] = 32;  // disagrees with the first registration
  auto r = put(other);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("disagrees"), std::string::npos) << r->body;
  EXPECT_EQ(client_->Put("/route", "{not json", "application/json")->status, 400);
  EXPECT_EQ(get("prefill_dp_rank=x&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0")->status, 400);
}

TEST_F(SglangRoutes, RoomDpRanksRegisterAndQuery) {
  auto r = client_->Post("/register_dp_rank", R"({"bootstrap_room": 12345678901234, "dp_rank": 3})", "application/json");
  ASSERT_EQ(r->status, 200);
  r = client_->Post("/query_dp_ranks", R"({"bootstrap_rooms": [12345678901234, 5]})", "application/json");
  ASSERT_EQ(r->status, 200);
  auto j = nlohmann::json::parse(r->body);
  EXPECT_EQ(j.size(), 1u);
  EXPECT_EQ(j["12345678901234"], 3);
  EXPECT_EQ(client_->Post("/register_dp_rank", R"({"bootstrap_room": -1, "dp_rank": 0})", "application/json")->status,
            400);
  EXPECT_EQ(client_->Post("/query_dp_ranks", R"({"bootstrap_rooms": 5})", "application/json")->status, 400);
}

TEST(SglangRegistry, RoomMapIsBoundedAndExpires) {
  bootstrap::SglangRegistry reg;
  const int64_t t0 = 1'000'000'000;
  ASSERT_EQ(reg.register_dp_rank({{"bootstrap_room", 1}, {"dp_rank", 0}}, t0).status, 200);
  auto q = reg.query_dp_ranks({{"bootstrap_rooms", {1}}}, t0 + 1);
  EXPECT_EQ(nlohmann::json::parse(q.body).size(), 1u);
  // Past the entry's lifetime it is gone.
  q = reg.query_dp_ranks({{"bootstrap_rooms", {1}}}, t0 + bootstrap::kSglangRoomTtlNs + 2);
  EXPECT_EQ(nlohmann::json::parse(q.body).size(), 0u);
}

}  // namespace
}  // namespace kvferry
