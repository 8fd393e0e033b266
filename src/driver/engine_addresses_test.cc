// The engine agreement sockets' addresses (EngineLoopConfig::bind_host / advertise_host,
// kvferry/net.h): a leader and a follower agree over IPv6 loopback and over a host name, the
// leader bound on a wildcard; the router is told the advertised engine endpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <cstdio>
#include <future>
#include <optional>
#include <string>

#include "driver/engine_loop.h"
#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/control.h"
#include "kvferry/net.h"
#include "kvferry/port_file.h"
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

// Runs a leader and a follower of one engine with these addresses until the router (bound on
// `router_host`) sees the engine ready; returns the ready frame's engine endpoint and shuts both
// down (each must exit 0). The leader binds port 0 and writes the port it got to a port file
// (kvferry/port_file.h), and only then is the follower started on endpoint_for(that port): a
// port picked free beforehand could be taken by another test before the leader binds it (seen:
// "Address already in use" in a fresh-clone run). *leader_endpoint: endpoint_for(bound port).
std::string agree(const std::string& router_host, const std::function<std::string(uint16_t)>& endpoint_for,
                  const std::string& leader_bind, const std::string& follower_bind,
                  const std::string& follower_advertise, std::string* leader_endpoint) {
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
  static int runs = 0;
  const std::string port_file =
      ::testing::TempDir() + "engine_addresses_" + std::to_string(::getpid()) + "_" + std::to_string(++runs) + ".port";
  std::remove(port_file.c_str());
  EngineLoopConfig cfg{leader_id, 2, endpoint_for(0), (*router)->endpoint()};
  cfg.idle_step_interval_us = 5000;
  cfg.bind_host = leader_bind;
  cfg.port_file = port_file;
  IdleDriver leader_driver, follower_driver;
  EngineLoop leader(cfg, **leader_core, leader_driver);
  auto leader_rc = std::async(std::launch::async, [&] { return leader.run(); });
  std::optional<uint16_t> port;
  for (auto until = std::chrono::steady_clock::now() + 30s; !port && std::chrono::steady_clock::now() < until;) {
    if (leader_rc.wait_for(10ms) == std::future_status::ready) break;  // it could not start
    port = read_port_file(port_file);
  }
  std::remove(port_file.c_str());
  EXPECT_TRUE(port) << "the leader never bound its engine socket";
  if (!port) {
    EXPECT_EQ(leader_rc.wait_for(10s), std::future_status::ready);
    return "";
  }
  *leader_endpoint = endpoint_for(*port);
  EngineLoopConfig fcfg = cfg;
  fcfg.self = follower_id;
  fcfg.engine_endpoint = *leader_endpoint;
  fcfg.port_file.clear();
  fcfg.bind_host = follower_bind;
  fcfg.advertise_host = follower_advertise;
  EngineLoop follower(fcfg, **follower_core, follower_driver);
  auto follower_rc = std::async(std::launch::async, [&] { return follower.run(); });
  std::string ready_endpoint;
  for (auto until = std::chrono::steady_clock::now() + 30s;
       ready_endpoint.empty() && std::chrono::steady_clock::now() < until;) {
    auto f = (*router)->recv(100ms);
    if (!f) continue;
    auto frame = decode_router_frame(*f);
    if (frame.ok() && frame->type == "ready") ready_endpoint = frame->ready_endpoint;
  }
  // The ready frame needs the follower's hello: the agreement ran over these addresses.
  EXPECT_FALSE(ready_endpoint.empty()) << "the engine never became ready";
  // Shut down through the advertised endpoint (the leader forwards it to the follower).
  for (auto until = std::chrono::steady_clock::now() + 30s;
       leader_rc.wait_for(50ms) != std::future_status::ready && std::chrono::steady_clock::now() < until;) {
    (void)(*router)->send(*leader_endpoint, encode_shutdown());
    (void)(*router)->recv(0ms);
  }
  EXPECT_EQ(leader_rc.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(follower_rc.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(leader_rc.get(), 0);
  EXPECT_EQ(follower_rc.get(), 0);
  return ready_endpoint;
}

TEST(EngineAddresses, Ipv6LoopbackWithWildcardLeader) {
  // The leader listens on every interface and advertises its endpoint's host; the follower binds ::1.
  std::string endpoint;
  const std::string ready = agree("::1", [](uint16_t port) { return zmq_endpoint("::1", port); }, "::", "::1", "",
                                  &endpoint);
  EXPECT_FALSE(endpoint.empty());
  EXPECT_EQ(ready, endpoint);
}

TEST(EngineAddresses, HostName) {
  std::string endpoint;
  const std::string ready =
      agree("localhost", [](uint16_t port) { return "tcp://localhost:" + std::to_string(port); }, "", "0.0.0.0",
            "localhost", &endpoint);
  EXPECT_FALSE(endpoint.empty());
  EXPECT_EQ(ready, endpoint);
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
