// The engine agreement sockets' addresses (EngineLoopConfig::bind_host / advertise_host,
// kvferry/net.h): a leader and a follower agree over IPv6 loopback and over a host name, the
// leader bound on a wildcard; the router is told the advertised engine endpoint.
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <string>

#include "driver/engine_loop.h"
#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/control.h"
#include "kvferry/net.h"
#include "driver/engine_protocol.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

class IdleDriver : public EngineDriver {
 public:
  void apply(const Decision&) override {}
  void pump(int64_t) override {}
  std::vector<RoomReport> reports(int64_t) override { return {}; }
  std::vector<Decision> decide(const std::map<uint64_t, std::vector<RoomReport>>&, std::vector<RouterRequest>,
                               int64_t, std::vector<RoomResult>*) override {
    return {};
  }
  RankLeakStats leak_stats() const override { return {}; }
  bool idle() const override { return true; }
};

// A port free on `host` (a numeric address): a plain socket bound to port 0, closed at once.
uint16_t free_port(const char* host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host, "0", &hints, &res) != 0) return 0;
  uint16_t port = 0;
  const int fd = ::socket(res->ai_family, SOCK_STREAM, 0);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return port;
}

// Runs a leader and a follower of one engine with these addresses until the router (bound on
// `router_host`) sees the engine ready; returns the ready frame's engine endpoint and shuts both
// down (each must exit 0).
std::string agree(const std::string& router_host, const std::string& engine_endpoint, const std::string& leader_bind,
                  const std::string& follower_bind, const std::string& follower_advertise = "") {
  ListenAddress ra;
  ra.bind_host = router_host;
  auto router = ControlSocket::bind(ra);
  EXPECT_TRUE(router.ok()) << router.status().str();
  if (!router.ok()) return "";
  RankId leader_id{Role::kDecode, 0, 0, 0}, follower_id{Role::kDecode, 0, 1, 0};
  auto leader_core = testing::make_test_manager(leader_id);
  auto follower_core = testing::make_test_manager(follower_id);
  EXPECT_TRUE(leader_core.ok() && follower_core.ok());
  if (!leader_core.ok() || !follower_core.ok()) return "";
  EngineLoopConfig cfg{leader_id, 2, engine_endpoint, (*router)->endpoint()};
  cfg.idle_step_interval_us = 5000;
  cfg.bind_host = leader_bind;
  EngineLoopConfig fcfg = cfg;
  fcfg.self = follower_id;
  fcfg.bind_host = follower_bind;
  fcfg.advertise_host = follower_advertise;
  IdleDriver leader_driver, follower_driver;
  EngineLoop leader(cfg, **leader_core, leader_driver);
  EngineLoop follower(fcfg, **follower_core, follower_driver);
  auto leader_rc = std::async(std::launch::async, [&] { return leader.run(); });
  auto follower_rc = std::async(std::launch::async, [&] { return follower.run(); });
  std::string ready_endpoint;
  for (auto until = std::chrono::steady_clock::now() + 10s;
       ready_endpoint.empty() && std::chrono::steady_clock::now() < until;) {
    auto f = (*router)->recv(100ms);
    if (!f) continue;
    auto frame = decode_router_frame(*f);
    if (frame.ok() && frame->type == "ready") ready_endpoint = frame->ready_endpoint;
  }
  // The ready frame needs the follower's hello: the agreement ran over these addresses.
  EXPECT_FALSE(ready_endpoint.empty()) << "the engine never became ready";
  // Shut down through the advertised endpoint (the leader forwards it to the follower).
  for (auto until = std::chrono::steady_clock::now() + 10s;
       leader_rc.wait_for(50ms) != std::future_status::ready && std::chrono::steady_clock::now() < until;) {
    (void)(*router)->send(engine_endpoint, encode_shutdown());
    (void)(*router)->recv(0ms);
  }
  EXPECT_EQ(leader_rc.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(follower_rc.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(leader_rc.get(), 0);
  EXPECT_EQ(follower_rc.get(), 0);
  return ready_endpoint;
}

TEST(EngineAddresses, Ipv6LoopbackWithWildcardLeader) {
  const uint16_t port = free_port("::1");
  ASSERT_NE(port, 0);
  const std::string endpoint = zmq_endpoint("::1", port);
  // The leader listens on every interface and advertises its endpoint's host; the follower binds ::1.
  EXPECT_EQ(agree("::1", endpoint, "::", "::1"), endpoint);
}

TEST(EngineAddresses, HostName) {
  const uint16_t port = free_port("127.0.0.1");
  ASSERT_NE(port, 0);
  const std::string endpoint = "tcp://localhost:" + std::to_string(port);
  EXPECT_EQ(agree("localhost", endpoint, "", "0.0.0.0", "localhost"), endpoint);
}

TEST(EngineAddresses, BadBindHostFailsToStart) {
  auto core = testing::make_test_manager(RankId{Role::kDecode, 0, 1, 0});
  ASSERT_TRUE(core.ok()) << core.status().str();
  EngineLoopConfig cfg{RankId{Role::kDecode, 0, 1, 0}, 2, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"};
  cfg.bind_host = "no-such-host.invalid";
  IdleDriver driver;
  EngineLoop follower(cfg, **core, driver);
  EXPECT_EQ(follower.run(), 2);  // could not start
}

}  // namespace
}  // namespace kvferry
