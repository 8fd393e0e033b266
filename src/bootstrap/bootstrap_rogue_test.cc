// Issue 33's attack, finding 2 (docs/security.md "The bootstrap service's MAC"): a decode rank asks
// whichever bootstrap address a request names, so a request can point it at a server of the
// attacker's. That server (a plain httplib server here) must learn nothing that authenticates any
// other request at the cluster's real bootstrap service: no bearer token, and no header that
// registers, looks up another rank or posts to the board there. What it can do is replay each
// captured request once, unchanged, within the window (learning that one answer).
// Uses only BootstrapClient/BootstrapServer and the keys, so it runs against the code before the
// MAC too: there the captured bearer token registers the attacker's entry and the test fails.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap_auth_test_util.h"
#include "core/secret.h"
#include "kvferry/bootstrap.h"

namespace kvferry {
namespace {

using namespace kvferry::testing;

const security::ClusterKeys kKeys = keys_of("bootstrap rogue test secret 0123456789");

struct Captured {
  std::string method, target, body, authorization;
};

// Answers every request 404 "not registered" (what a real service says before a rank registers, so
// the decode side keeps asking) and keeps what it was sent.
class RogueServer {
 public:
  RogueServer() {
    auto keep = [this](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard lock(mu_);
        got_.push_back({req.method, req.target, req.body, req.get_header_value("Authorization")});
      }
      res.status = 404;
      res.set_content(R"({"error":"not registered"})", "application/json");
    };
    http_.Get(R"(/.*)", keep);
    http_.Put(R"(/.*)", keep);
    http_.Post(R"(/.*)", keep);
    port_ = http_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { http_.listen_after_bind(); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!http_.is_running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(http_.is_running()) << "the rogue server did not start";
  }
  ~RogueServer() {
    http_.stop();
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::vector<Captured> captured() {
    std::lock_guard lock(mu_);
    return got_;
  }

 private:
  httplib::Server http_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Captured> got_;
};

PrefillRankInfo liar_rank() { return test_rank("tcp://127.0.0.1:6666"); }  // the attacker's endpoint

class BootstrapRogue : public ::testing::Test {
 protected:
  void SetUp() override {
    real_ = start_service(&kKeys);
    ASSERT_TRUE(real_);
    // What a decode rank asks the bootstrap address a request named: lookups, the failure board.
    BootstrapClient decode(rogue_.address(), 5000, &kKeys);
    (void)decode.lookup(0, 0, 0);
    (void)decode.lookup_all(0, 0);
    (void)decode.lookup_failure(7);
    Failure f;
    f.origin = RankId{Role::kDecode, 0, 0, 0};
    f.code = ErrorCode::kTransferError;
    f.reason = "test";
    f.wall_ns = 1;
    (void)decode.post_failure(7, f);
    (void)decode.health();
    captured_ = rogue_.captured();
    ASSERT_EQ(captured_.size(), 5u);
  }
  httplib::Client raw() {
    httplib::Client c("127.0.0.1", real_->port());
    c.set_connection_timeout(std::chrono::seconds(5));
    c.set_read_timeout(std::chrono::seconds(5));
    return c;
  }
  RogueServer rogue_;
  std::unique_ptr<BootstrapServer> real_;
  std::vector<Captured> captured_;
};

TEST_F(BootstrapRogue, WhatTheRogueCapturesAuthenticatesNoOtherRequest) {
  // The attacker's registration, as the bootstrap client would send it to the real service.
  std::string liar_body;
  {
    RogueServer probe;
    BootstrapClient c(probe.address(), 5000, nullptr);
    (void)c.register_rank(liar_rank());
    ASSERT_EQ(probe.captured().size(), 1u);
    liar_body = probe.captured()[0].body;
  }
  auto c = raw();
  for (const Captured& got : captured_) {
    SCOPED_TRACE(got.method + " " + got.target + " with " + got.authorization);
    ASSERT_FALSE(got.authorization.empty());
    EXPECT_EQ(got.authorization.find(kKeys.bearer_token), std::string::npos) << "the bearer token went to the rogue";
    const httplib::Headers h{{"Authorization", got.authorization}};
    auto put = c.Put("/route", h, liar_body, "application/json");
    ASSERT_TRUE(put);
    EXPECT_EQ(put->status, 401);
    auto dp = c.Post("/register_dp_rank", h, R"({"bootstrap_room":5,"dp_rank":0})", "application/json");
    ASSERT_TRUE(dp);
    EXPECT_EQ(dp->status, 401);
    auto other = c.Get("/route?engine_id=0&dp_rank=0&tp_rank=1", h);
    ASSERT_TRUE(other);
    EXPECT_EQ(other->status, 401);
    auto board = c.Get("/failure?room=8", h);
    ASSERT_TRUE(board);
    EXPECT_EQ(board->status, 401);
  }
  EXPECT_EQ(real_->registered(), 0u) << "a captured header registered the attacker's entry";
}

// What is left to the rogue: each captured request, replayed unchanged at the real service, once.
TEST_F(BootstrapRogue, ACapturedLookupReplaysOnceAtMost) {
  BootstrapClient prefill(real_->address(), 5000, &kKeys);
  PrefillRankInfo honest = liar_rank();
  honest.control_endpoint = "tcp://127.0.0.1:5600";
  ASSERT_TRUE(prefill.register_rank(honest).ok());
  const Captured& lookup = captured_[0];
  ASSERT_EQ(lookup.target, "/route?engine_id=0&dp_rank=0&tp_rank=0");
  auto c = raw();
  const httplib::Headers h{{"Authorization", lookup.authorization}};
  auto first = c.Get(lookup.target, h);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200);
  EXPECT_NE(first->body.find("tcp://127.0.0.1:5600"), std::string::npos);
  auto second = c.Get(lookup.target, h);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->status, 401);
}

}  // namespace
}  // namespace kvferry
