// EngineLoop's leader/follower agreement over real ZeroMQ sockets, one thread per rank, with a
// driver that does nothing but can stall: what happens to a follower the leader marked down.
#include "driver/engine_loop.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "driver/sync_codec.h"
#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/control.h"
#include "replay/router_protocol.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

// No rooms; pump() stalls once for `stall_ms` when asked to; the leader side counts down ranks.
class StallingDriver : public EngineDriver {
 public:
  void apply(const Decision&) override {}
  void pump(int64_t) override {
    int ms = stall_ms.exchange(0);
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  std::vector<RoomReport> reports(int64_t) override { return {}; }
  std::vector<Decision> decide(const std::map<uint64_t, std::vector<RoomReport>>&, std::vector<RouterRequest>,
                               int64_t, std::vector<RoomResult>*) override {
    ranks_down = down_ranks_.size();
    return {};
  }
  RankLeakStats leak_stats() const override { return {}; }
  bool idle() const override { return true; }

  std::atomic<int> stall_ms{0};
  std::atomic<size_t> ranks_down{0};
};

// A free local TCP endpoint: a plain socket is bound to port 0 and closed at once (a ZeroMQ
// socket would release its port only later, on its I/O thread).
std::string free_endpoint() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

// Rescue for a failed test: binds the (gone) leader's endpoint, waits for the follower's hello
// and steps it to its end.
void stand_in_for_leader(const std::string& leader_endpoint, std::future<int>& follower_rc) {
  auto stand_in = ControlSocket::bind(leader_endpoint);
  ASSERT_TRUE(stand_in.ok()) << stand_in.status().str();
  std::string endpoint;
  for (auto until = std::chrono::steady_clock::now() + 10s; endpoint.empty() && std::chrono::steady_clock::now() < until;)
    if (auto f = (*stand_in)->recv(100ms); f) {
      auto h = decode_sync_frame(*f);
      if (h.ok() && h->type == "hello") endpoint = h->endpoint;
    }
  ASSERT_FALSE(endpoint.empty());
  for (int i = 0; i < 50 && follower_rc.wait_for(100ms) != std::future_status::ready; ++i)
    (void)(*stand_in)->send(endpoint, encode_step(1'000'000 + i, true, {}));
}

TEST(EngineLoop, LeaderSendsShutdownStepToFollowerItMarkedDown) {
  auto router = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(router.ok());
  RankId leader_id{Role::kDecode, 0, 0, 0}, follower_id{Role::kDecode, 0, 1, 0};
  auto leader_core = testing::make_test_core(leader_id);
  auto follower_core = testing::make_test_core(follower_id);
  ASSERT_TRUE(leader_core.ok()) << leader_core.status().str();
  ASSERT_TRUE(follower_core.ok()) << follower_core.status().str();

  EngineLoopConfig cfg{leader_id, 2, free_endpoint(), (*router)->endpoint()};
  cfg.idle_step_interval_us = 5000;
  cfg.peer_timeout_ms = 100;  // the follower's stall (600 ms) is far longer
  EngineLoopConfig fcfg = cfg;
  fcfg.self = follower_id;

  StallingDriver leader_driver, follower_driver;
  EngineLoop leader(cfg, **leader_core, leader_driver, [](const Message&) {}, [](const TransportEvent&) {});
  EngineLoop follower(fcfg, **follower_core, follower_driver, [](const Message&) {}, [](const TransportEvent&) {});
  auto leader_rc = std::async(std::launch::async, [&] { return leader.run(); });
  auto follower_rc = std::async(std::launch::async, [&] { return follower.run(); });
  // However the test ends, both loops end first (each would run on, and the futures wait for them).
  struct Finally {
    std::function<void()> f;
    ~Finally() { f(); }
  } finally{[&] {
    if (leader_rc.valid() && leader_rc.wait_for(0s) != std::future_status::ready) {
      (void)(*router)->send(cfg.engine_endpoint, encode_shutdown());
      leader_rc.wait();
    }
    if (follower_rc.valid() && follower_rc.wait_for(0s) != std::future_status::ready)
      stand_in_for_leader(cfg.engine_endpoint, follower_rc);
  }};

  // The engine is up once the leader tells the router it is ready.
  bool ready = false;
  for (auto until = std::chrono::steady_clock::now() + 10s; !ready && std::chrono::steady_clock::now() < until;) {
    auto f = (*router)->recv(100ms);
    ready = f && f->find("\"ready\"") != std::string::npos;
  }
  ASSERT_TRUE(ready);
  // The follower stalls; the leader marks it down after peer_timeout_ms without a reply.
  follower_driver.stall_ms = 600;
  for (auto until = std::chrono::steady_clock::now() + 5s;
       leader_driver.ranks_down == 0 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(leader_driver.ranks_down, 1u);

  // The router ends the run while the follower is still marked down.
  ASSERT_TRUE((*router)->send(cfg.engine_endpoint, encode_shutdown()).ok());
  ASSERT_EQ(leader_rc.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(leader_rc.get(), 0);
  // The follower wakes up, finds the shutdown step and exits 0. Without it (the naive leader only
  // steps the followers it still counts) the follower waits for a leader forever.
  ASSERT_EQ(follower_rc.wait_for(5s), std::future_status::ready)
      << "the follower marked down never got the shutdown step";
  EXPECT_EQ(follower_rc.get(), 0);
}

}  // namespace
}  // namespace kvferry
