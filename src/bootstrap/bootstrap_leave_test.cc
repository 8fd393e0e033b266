// A rank that leaves removes its bootstrap entry (DELETE /route, BootstrapClient::deregister;
// include/kvferry/bootstrap.h): only at its own incarnation, only with the cluster's MAC when the
// service has a secret, and a refused DELETE changes nothing. A lookup of the key then answers 410
// ("left"), which the client reports as permanent (bootstrap/refusal.h) so a decode rank's lookup
// stops at once instead of waiting out lookup_timeout_ms; a new registration brings it back.
#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "bootstrap/bootstrap_auth_test_util.h"
#include "bootstrap/refusal.h"
#include "core/request_mac.h"
#include "kvferry/bootstrap.h"

namespace kvferry {
namespace {

using namespace kvferry::testing;

const security::ClusterKeys kKeys = keys_of("bootstrap leave test secret 0123456789");
const security::ClusterKeys kOther = keys_of("another cluster's secret 0123456789");

PrefillRankInfo rank_at(uint32_t tp, uint64_t incarnation) {
  PrefillRankInfo r = test_rank("tcp://127.0.0.1:" + std::to_string(5600 + tp));
  r.tp_rank = tp;
  r.tp_size = 2;
  r.incarnation = incarnation;
  return r;
}

constexpr uint64_t kInc = 1'764'000'000'000'000'000ull;

TEST(BootstrapLeave, DeregisterRemovesTheEntryAndLookupsSayItLeft) {
  auto server = start_service(nullptr);
  ASSERT_TRUE(server);
  BootstrapClient c("127.0.0.1:" + std::to_string(server->port()), 2000, nullptr);
  ASSERT_TRUE(c.register_rank(rank_at(0, kInc)).ok());
  ASSERT_TRUE(c.register_rank(rank_at(1, kInc + 1)).ok());
  ASSERT_TRUE(c.deregister(0, 0, 0, kInc).ok());
  EXPECT_EQ(server->registered(), 1u);
  EXPECT_EQ(server->deregistrations(), 1u);
  auto gone = c.lookup(0, 0, 0);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), ErrorCode::kPeerUnreachable);
  EXPECT_TRUE(bootstrap::rank_left(gone.status())) << gone.status().str();
  EXPECT_TRUE(bootstrap::permanent(gone.status()));
  EXPECT_NE(gone.status().message().find("tp_rank 0"), std::string::npos) << gone.status().str();
  // The other rank is still there, and the DP group's list no longer has the one that left.
  EXPECT_TRUE(c.lookup(0, 0, 1).ok());
  auto all = c.lookup_all(0, 0);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].tp_rank, 1u);
  // A key never registered is "not registered" (not yet there: callers retry), not "left".
  auto never = c.lookup(0, 0, 7);
  ASSERT_FALSE(never.ok());
  EXPECT_FALSE(bootstrap::permanent(never.status()));
  // A second DELETE finds nothing to remove.
  Status again = c.deregister(0, 0, 0, kInc);
  EXPECT_EQ(again.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(again.message().find("not registered"), std::string::npos) << again.str();
  // The rank registers again (a new process): found again.
  ASSERT_TRUE(c.register_rank(rank_at(0, kInc + 5)).ok());
  auto back = c.lookup(0, 0, 0);
  ASSERT_TRUE(back.ok()) << back.status().str();
  EXPECT_EQ(back->incarnation, kInc + 5);
}

TEST(BootstrapLeave, AnotherIncarnationRemovesNothing) {
  auto server = start_service(nullptr);
  ASSERT_TRUE(server);
  BootstrapClient c("127.0.0.1:" + std::to_string(server->port()), 2000, nullptr);
  ASSERT_TRUE(c.register_rank(rank_at(0, kInc + 10)).ok());
  // The previous process (an older incarnation) leaving late, or any other one: refused.
  for (uint64_t inc : {kInc, kInc + 11, uint64_t{0}}) {
    Status s = c.deregister(0, 0, 0, inc);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.str();
    EXPECT_NE(s.message().find("is not the registered"), std::string::npos) << s.str();
  }
  EXPECT_EQ(server->registered(), 1u);
  EXPECT_EQ(server->deregistrations(), 0u);
  EXPECT_EQ(server->refused_deregistrations(), 3u);
  auto still = c.lookup(0, 0, 0);
  ASSERT_TRUE(still.ok()) << still.status().str();
  EXPECT_EQ(still->incarnation, kInc + 10);
}

TEST(BootstrapLeave, MalformedDeletesAre400AndChangeNothing) {
  auto server = start_service(nullptr);
  ASSERT_TRUE(server);
  BootstrapClient c("127.0.0.1:" + std::to_string(server->port()), 2000, nullptr);
  ASSERT_TRUE(c.register_rank(rank_at(0, kInc)).ok());
  httplib::Client raw("127.0.0.1", server->port());
  const std::string inc = std::to_string(kInc);
  for (const std::string& target : std::vector<std::string>{
           "/route?engine_id=0&dp_rank=0&tp_rank=0", "/route?engine_id=0&dp_rank=0&incarnation=" + inc,
        "/route?engine_id=0&dp_rank=0&tp_rank=0&incarnation=-1", "/route?engine_id=0&dp_rank=0&tp_rank=0&incarnation=1x",
        "/route?engine_id=0&dp_rank=0&tp_rank=0&incarnation=99999999999999999999999", "/route"}) {
    SCOPED_TRACE(target);
    auto res = raw.Delete(target);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400);
  }
  EXPECT_EQ(server->registered(), 1u);
  EXPECT_TRUE(c.lookup(0, 0, 0).ok());
}

// One HTTP request from source address `from` (a loopback address other than 127.0.0.1); the
// answer's status line ("" if none).
std::string status_line_from(const char* from, uint16_t port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  std::string got;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) == 0 &&
      ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) == 0 &&
      ::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
    char buf[512];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) got.assign(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got.substr(0, got.find("\r\n"));
}

TEST(BootstrapLeave, AnEntryFromItsOwnHostIsRemovedFromThatAddressOnly) {
  auto server = start_service(nullptr);
  ASSERT_TRUE(server);
  BootstrapClient c("127.0.0.1:" + std::to_string(server->port()), 2000, nullptr);
  ASSERT_TRUE(c.register_rank(rank_at(0, kInc)).ok());  // tcp://127.0.0.1:...: its own host
  const std::string del = "DELETE /route?engine_id=0&dp_rank=0&tp_rank=0&incarnation=" + std::to_string(kInc) +
                          " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  EXPECT_EQ(status_line_from("127.0.0.2", server->port(), del), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(server->registered(), 1u);
  EXPECT_EQ(server->refused_deregistrations(), 1u);
  ASSERT_TRUE(c.lookup(0, 0, 0).ok());
  EXPECT_EQ(status_line_from("127.0.0.1", server->port(), del), "HTTP/1.1 200 OK");
  EXPECT_EQ(server->registered(), 0u);
}

TEST(BootstrapLeave, WithTheSecretADeleteWithoutTheClustersMacIsRefused) {
  auto server = start_service(&kKeys);
  ASSERT_TRUE(server);
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  BootstrapClient c(address, 2000, &kKeys);
  ASSERT_TRUE(c.register_rank(rank_at(0, kInc)).ok());
  const std::string target = "/route?engine_id=0&dp_rank=0&tp_rank=0&incarnation=" + std::to_string(kInc);
  httplib::Client raw("127.0.0.1", server->port());
  raw.set_url_encode(false);
  // No MAC, another cluster's MAC, a MAC of the lookup (another method), of another incarnation.
  auto none = raw.Delete(target);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  auto other = raw.Delete(target, {{"Authorization", security::mac_authorization(kOther, "DELETE", target, "")}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 401);
  auto get_mac = raw.Delete(target, {{"Authorization", security::mac_authorization(kKeys, "GET", target, "")}});
  ASSERT_TRUE(get_mac);
  EXPECT_EQ(get_mac->status, 401);
  auto moved = raw.Delete(target, {{"Authorization", security::mac_authorization(
                                                         kKeys, "DELETE", target + "0", "")}});
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved->status, 401);
  // The client of another cluster: not authorized, permanent.
  BootstrapClient stranger(address, 2000, &kOther);
  Status s = stranger.deregister(0, 0, 0, kInc);
  EXPECT_TRUE(bootstrap::not_authorized(s)) << s.str();
  EXPECT_EQ(server->registered(), 1u);
  EXPECT_EQ(server->deregistrations(), 0u);
  ASSERT_TRUE(c.lookup(0, 0, 0).ok());
  // The cluster's own client removes it.
  ASSERT_TRUE(c.deregister(0, 0, 0, kInc).ok());
  EXPECT_EQ(server->registered(), 0u);
  EXPECT_TRUE(bootstrap::rank_left(c.lookup(0, 0, 0).status()));
}

}  // namespace
}  // namespace kvferry
