// EngineLoop's leader/follower agreement over real ZeroMQ sockets, one thread per rank, with a
// driver that does nothing but can stall: what happens to a follower the leader marked down; and
// the failure fan-out, which reaches a sibling with no step in between.
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
#include <mutex>
#include <set>
#include <thread>

#include "driver/engine_protocol.h"
#include "driver/sync_codec.h"
#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/control.h"
#include "kvferry/log.h"

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

// Whether a frame of `type` reaches `socket` within `within` (others are skipped).
bool wait_for_frame(ControlSocket& socket, const std::string& type, std::chrono::milliseconds within) {
  for (auto until = std::chrono::steady_clock::now() + within; std::chrono::steady_clock::now() < until;) {
    auto f = socket.recv(100ms);
    if (f && f->find("\"" + type + "\"") != std::string::npos) return true;
  }
  return false;
}

// A leader and a follower of one decode engine over real ZeroMQ, each loop on a thread of its
// own, and the router's socket. However the test ends, both loops end first (each would run on,
// and the futures wait for them). `tune` adjusts both ranks' config.
template <class Driver>
class TwoRanks {
 public:
  explicit TwoRanks(const std::function<void(EngineLoopConfig&)>& tune = {}) {
    auto router = ControlSocket::bind("tcp://127.0.0.1:0");
    auto lc = testing::make_test_manager(kLeader), fc = testing::make_test_manager(kFollower);
    if (!router.ok() || !lc.ok() || !fc.ok()) {
      error_ = !router.ok() ? router.status().str() : !lc.ok() ? lc.status().str() : fc.status().str();
      return;
    }
    router_ = std::move(router).value();
    leader_core_ = std::move(lc).value();
    follower_core_ = std::move(fc).value();
    cfg = EngineLoopConfig{kLeader, 2, free_endpoint(), router_->endpoint()};
    cfg.idle_step_interval_us = 5000;
    if (tune) tune(cfg);
    EngineLoopConfig fcfg = cfg;
    fcfg.self = kFollower;
    leader_ = std::make_unique<EngineLoop>(cfg, *leader_core_, leader_driver);
    follower_ = std::make_unique<EngineLoop>(fcfg, *follower_core_, follower_driver);
    leader_rc = std::async(std::launch::async, [this] { return leader_->run(); });
    follower_rc = std::async(std::launch::async, [this] { return follower_->run(); });
  }
  ~TwoRanks() {
    if (leader_rc.valid() && leader_rc.wait_for(0s) != std::future_status::ready) {
      (void)router_->send(cfg.engine_endpoint, encode_shutdown());
      leader_rc.wait();
    }
    if (follower_rc.valid() && follower_rc.wait_for(0s) != std::future_status::ready)
      stand_in_for_leader(cfg.engine_endpoint, follower_rc);
  }
  const std::string& error() const { return error_; }
  ControlSocket& router() { return *router_; }
  // Whether a frame of `type` reaches the router within `within` (others are skipped).
  bool router_gets(const std::string& type, std::chrono::milliseconds within) {
    return wait_for_frame(*router_, type, within);
  }
  // The router's shutdown; both loops then end with 0.
  void shut_down(std::chrono::milliseconds within) {
    ASSERT_TRUE(router_->send(cfg.engine_endpoint, encode_shutdown()).ok());
    ASSERT_EQ(leader_rc.wait_for(within), std::future_status::ready);
    EXPECT_EQ(leader_rc.get(), 0);
    ASSERT_EQ(follower_rc.wait_for(within), std::future_status::ready) << "the follower never ended";
    EXPECT_EQ(follower_rc.get(), 0);
  }

  static constexpr RankId kLeader{Role::kDecode, 0, 0, 0}, kFollower{Role::kDecode, 0, 1, 0};
  Driver leader_driver, follower_driver;
  EngineLoopConfig cfg;
  std::future<int> leader_rc, follower_rc;

 private:
  std::string error_;
  std::unique_ptr<ControlSocket> router_;
  std::unique_ptr<Manager> leader_core_, follower_core_;
  std::unique_ptr<EngineLoop> leader_, follower_;
};

TEST(EngineLoop, LeaderSendsShutdownStepToFollowerItMarkedDown) {
  // The follower's stall (1500 ms) is far longer than the leader's patience with a follower whose
  // engine socket still accepts (it is alive, only stalled): PeerMonitor::kHungFactor x 100 ms.
  TwoRanks<StallingDriver> e([](EngineLoopConfig& c) { c.peer_timeout_ms = 100; });
  ASSERT_TRUE(e.error().empty()) << e.error();
  // The engine is up once the leader tells the router it is ready.
  ASSERT_TRUE(e.router_gets("ready", 10s));
  // The follower stalls; the leader marks it down after peer_timeout_ms without a reply.
  e.follower_driver.stall_ms = 1500;
  for (auto until = std::chrono::steady_clock::now() + 5s;
       e.leader_driver.ranks_down == 0 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(e.leader_driver.ranks_down, 1u);

  // The router ends the run while the follower is still marked down.
  ASSERT_TRUE(e.router().send(e.cfg.engine_endpoint, encode_shutdown()).ok());
  ASSERT_EQ(e.leader_rc.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(e.leader_rc.get(), 0);
  // The follower wakes up, finds the shutdown step and exits 0. Without it (the naive leader only
  // steps the followers it still counts) the follower waits for a leader forever.
  ASSERT_EQ(e.follower_rc.wait_for(5s), std::future_status::ready)
      << "the follower marked down never got the shutdown step";
  EXPECT_EQ(e.follower_rc.get(), 0);
}

// A follower that stalled past the leader's patience (stopped, starved) and runs again is told by
// the leader that it was declared down ("down" frame), fails its rooms without a line of its own
// (the leader's was the engine's one line) and rejoins at once. Naive design: it learns nothing,
// waits out the leader's silence, then declares the live leader dead (a second line, blaming the
// wrong rank), and the engine runs without it for that long.
TEST(EngineLoop, StalledFollowerToldItIsDownRejoinsAtOnce) {
  // The leader waits out a live, stalled follower 4 x 200 ms.
  TwoRanks<StallingDriver> e([](EngineLoopConfig& c) { c.peer_timeout_ms = 200; });
  ASSERT_TRUE(e.error().empty()) << e.error();
  ASSERT_TRUE(e.router_gets("ready", 10s));
  const uint64_t lines0 = lines_above_debug();
  e.follower_driver.stall_ms = 2000;
  for (auto until = std::chrono::steady_clock::now() + 10s;
       e.leader_driver.ranks_down == 0 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(e.leader_driver.ranks_down, 1u);
  // It runs again: told it is down, it rejoins; the leader counts it up again (a rank_up frame).
  ASSERT_TRUE(e.router_gets("rank_up", 20s)) << "the stalled follower never rejoined";
  for (auto until = std::chrono::steady_clock::now() + 5s;
       e.leader_driver.ranks_down != 0 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(e.leader_driver.ranks_down, 0u);
  // One line above debug for the stall: the leader's. The follower did not blame the leader.
  EXPECT_EQ(lines_above_debug() - lines0, 1u);
  e.shut_down(10s);
}

// A follower exits as soon as it answered the shutdown step, and that answer may be lost with it.
// Here a stand-in follower answers every step but the shutdown one and closes its socket: the
// leader finds it gone (its socket refuses) and ends at once, without declaring it dead. Seen
// before under load: the leader waited its whole peer timeout and logged a dead follower (and,
// meanwhile, a dead prefill peer that had exited too) at the end of a clean run.
TEST(EngineLoop, FollowerGoneAfterTheShutdownStepIsNotDead) {
  auto router = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(router.ok());
  const RankId leader_id{Role::kDecode, 0, 0, 0};
  auto leader_core = testing::make_test_manager(leader_id);
  ASSERT_TRUE(leader_core.ok()) << leader_core.status().str();
  EngineLoopConfig cfg{leader_id, 2, free_endpoint(), (*router)->endpoint()};
  cfg.idle_step_interval_us = 5000;
  cfg.peer_timeout_ms = 60000;  // waiting it out would take a minute
  StallingDriver leader_driver;
  EngineLoop leader(cfg, **leader_core, leader_driver);
  auto leader_rc = std::async(std::launch::async, [&] { return leader.run(); });
  auto follower = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(follower.ok());
  std::atomic<bool> got_shutdown{false};
  auto follower_rc = std::async(std::launch::async, [&] {
    bool hello_answered = false;
    for (auto until = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < until;) {
      if (!hello_answered) (void)(*follower)->send(cfg.engine_endpoint, encode_hello(1, (*follower)->endpoint()));
      auto text = (*follower)->recv(50ms);
      if (!text) continue;
      auto f = decode_sync_frame(*text);
      if (!f.ok() || f->type != "step") continue;
      hello_answered = true;
      if (f->shutdown) {
        got_shutdown = true;
        (*follower).reset();  // gone without a word
        return;
      }
      (void)(*follower)->send(cfg.engine_endpoint, encode_reply(f->seq, 1, {}, {}));
    }
  });
  ASSERT_TRUE(wait_for_frame(**router, "ready", 10s));
  const uint64_t lines0 = lines_above_debug();
  ASSERT_TRUE((*router)->send(cfg.engine_endpoint, encode_shutdown()).ok());
  follower_rc.wait();
  ASSERT_TRUE(got_shutdown);
  ASSERT_EQ(leader_rc.wait_for(20s), std::future_status::ready) << "the leader waited for the gone follower";
  EXPECT_EQ(leader_rc.get(), 0);
  EXPECT_EQ(lines_above_debug(), lines0);
  EXPECT_EQ(leader_driver.ranks_down, 0u);
}

// Rooms it is told about; a failure to fan out when asked to; what siblings told it, with the
// number of steps the leader had made by then (`leader_steps`: reports() runs once per step).
// Its decide() never fails a room, so the agreement cannot carry a failure.
class FanOutDriver : public StallingDriver {
 public:
  std::vector<RoomReport> reports(int64_t) override {
    ++steps;
    return {};
  }
  std::vector<SiblingFailure> take_failures_to_fan_out() override {
    std::lock_guard lock(mu);
    return std::exchange(to_send, {});
  }
  bool on_sibling_failure(const SiblingFailure& f) override {
    std::lock_guard lock(mu);
    ++attempts;
    if (!rooms.count(f.room)) return false;
    received.push_back(f);
    leader_steps_at_receipt.push_back(leader_steps ? leader_steps->load() : 0);
    return true;
  }
  void fail_first_hand(const SiblingFailure& f) {
    std::lock_guard lock(mu);
    to_send.push_back(f);
  }
  std::vector<SiblingFailure> got() {
    std::lock_guard lock(mu);
    return received;
  }

  std::mutex mu;
  std::set<uint64_t> rooms;
  std::vector<SiblingFailure> to_send, received;
  std::vector<uint64_t> leader_steps_at_receipt;
  std::atomic<uint64_t> steps{0};
  const std::atomic<uint64_t>* leader_steps = nullptr;
  std::atomic<uint64_t> attempts{0};
};

bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  for (auto until = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < until;) {
    if (pred()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return pred();
}

TEST(EngineLoop, FollowerFailureReachesSiblingWithoutAStep) {
  auto router = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(router.ok());
  constexpr uint32_t kTp = 3;
  std::vector<std::unique_ptr<Manager>> cores;
  std::vector<std::unique_ptr<FanOutDriver>> drivers;
  std::vector<std::unique_ptr<EngineLoop>> loops;
  EngineLoopConfig cfg{RankId{Role::kPrefill, 0, 0, 0}, kTp, free_endpoint(), (*router)->endpoint()};
  cfg.idle_step_interval_us = 2000;
  cfg.peer_timeout_ms = 20000;  // the leader's stall below must not make it give up on anyone
  for (uint32_t tp = 0; tp < kTp; ++tp) {
    RankId id{Role::kPrefill, 0, tp, 0};
    auto core = testing::make_test_manager(id);
    ASSERT_TRUE(core.ok()) << core.status().str();
    cores.push_back(std::move(*core));
    drivers.push_back(std::make_unique<FanOutDriver>());
    if (tp > 0) drivers.back()->leader_steps = &drivers[0]->steps;
    EngineLoopConfig c = cfg;
    c.self = id;
    loops.push_back(std::make_unique<EngineLoop>(c, *cores.back(), *drivers.back()));
  }
  std::vector<std::future<int>> rcs;
  for (auto& l : loops) rcs.push_back(std::async(std::launch::async, [&l] { return l->run(); }));
  struct Finally {
    std::function<void()> f;
    ~Finally() { f(); }
  } finally{[&] {
    drivers[0]->stall_ms = 0;
    if (rcs[0].valid() && rcs[0].wait_for(0s) != std::future_status::ready) {
      (void)(*router)->send(cfg.engine_endpoint, encode_shutdown());
      rcs[0].wait();
    }
    for (uint32_t tp = 1; tp < kTp; ++tp)
      if (rcs[tp].valid() && rcs[tp].wait_for(0s) != std::future_status::ready)
        stand_in_for_leader(cfg.engine_endpoint, rcs[tp]);
  }};
  bool ready = false;
  for (auto until = std::chrono::steady_clock::now() + 10s; !ready && std::chrono::steady_clock::now() < until;) {
    auto f = (*router)->recv(100ms);
    ready = f && f->find("\"ready\"") != std::string::npos;
  }
  ASSERT_TRUE(ready);
  // Every follower answered a few steps: the step naming both followers went out before those.
  ASSERT_TRUE(wait_for([&] { return drivers[1]->steps >= 3 && drivers[2]->steps >= 3; }, 5s));
  for (auto& d : drivers) {
    std::lock_guard lock(d->mu);
    d->rooms = {11};
  }
  // The leader stalls (no step) while follower tp1 fails room 11 first-hand.
  drivers[0]->stall_ms = 1500;
  ASSERT_TRUE(wait_for([&] { return drivers[0]->stall_ms == 0; }, 2s));  // the stall began
  const uint64_t leader_steps_before = drivers[0]->steps;
  SiblingFailure f{11, 1, ErrorCode::kTransferError, "prefill/tp1", "write failed", 12345};
  drivers[1]->fail_first_hand(f);
  ASSERT_TRUE(wait_for([&] { return !drivers[2]->got().empty(); }, 1s)) << "tp2 never heard of tp1's failure";
  auto got = drivers[2]->got();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].room, 11u);
  EXPECT_EQ(got[0].tp_rank, 1u);
  EXPECT_EQ(got[0].code, ErrorCode::kTransferError);
  EXPECT_EQ(got[0].origin, "prefill/tp1");
  EXPECT_EQ(got[0].reason, "write failed");
  EXPECT_EQ(got[0].first_seen_ns, 12345);
  {
    std::lock_guard lock(drivers[2]->mu);
    EXPECT_EQ(drivers[2]->leader_steps_at_receipt[0], leader_steps_before) << "the leader stepped in between";
  }
  // The leader hears of it too once its stall is over; the sender is not told its own failure.
  ASSERT_TRUE(wait_for([&] { return !drivers[0]->got().empty(); }, 5s));
  EXPECT_EQ(drivers[0]->got()[0].origin, "prefill/tp1");
  EXPECT_TRUE(drivers[1]->got().empty());

  // A fail frame for a room tp2 does not have yet is kept and applied once a step has made it.
  SiblingFailure early{12, 1, ErrorCode::kInjected, "prefill/tp1", "early", 777};
  const uint64_t attempts_before = drivers[2]->attempts;
  drivers[1]->fail_first_hand(early);
  ASSERT_TRUE(wait_for([&] { return drivers[2]->attempts > attempts_before; }, 5s));
  EXPECT_EQ(drivers[2]->got().size(), 1u);
  {
    std::lock_guard lock(drivers[2]->mu);
    drivers[2]->rooms.insert(12);
  }
  ASSERT_TRUE(wait_for([&] { return drivers[2]->got().size() == 2; }, 5s)) << "the kept frame was never applied";
  EXPECT_EQ(drivers[2]->got()[1].room, 12u);
  EXPECT_EQ(drivers[2]->got()[1].first_seen_ns, 777);

  ASSERT_TRUE((*router)->send(cfg.engine_endpoint, encode_shutdown()).ok());
  for (auto& rc : rcs) {
    ASSERT_EQ(rc.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(rc.get(), 0);
  }
}

// A quarantined room's reclaim through the real agreement: each rank's reclaim reports reach the
// leader's decide() (the follower's in its reply), and the kReclaim decided once both ranks
// reported reaches both ranks' apply().
class ReclaimDriver : public StallingDriver {
 public:
  std::vector<RoomReport> reclaim_reports() const override {
    std::lock_guard lock(mu);
    return reclaimed;
  }
  std::vector<Decision> decide(const std::map<uint64_t, std::vector<RoomReport>>& by_room, std::vector<RouterRequest>,
                               int64_t, std::vector<RoomResult>*) override {
    std::lock_guard lock(mu);
    auto it = by_room.find(21);
    if (it == by_room.end() || decided) return {};
    std::set<uint32_t> ranks;
    for (const RoomReport& r : it->second)
      if (r.reclaimed) ranks.insert(r.tp_rank);
    seen_ranks = ranks;
    if (ranks.size() < 2) return {};
    decided = true;
    return {{Decision::Op::kReclaim, 21}};
  }
  void apply(const Decision& d) override {
    std::lock_guard lock(mu);
    if (d.op == Decision::Op::kReclaim) {
      applied.push_back(d.room);
      reclaimed.clear();  // as DecodeDriver: reclaimed, no longer reported
    }
  }
  void reclaim(uint64_t room, uint32_t tp) {
    std::lock_guard lock(mu);
    RoomReport r;
    r.room = room;
    r.tp_rank = tp;
    r.reclaimed = true;
    reclaimed = {r};
  }
  template <typename F>
  auto locked(F f) {
    std::lock_guard lock(mu);
    return f();
  }

  mutable std::mutex mu;
  std::vector<RoomReport> reclaimed;
  std::set<uint32_t> seen_ranks;
  bool decided = false;
  std::vector<uint64_t> applied;
};

TEST(EngineLoop, ReclaimReportsReachTheLeaderAndItsReclaimReachesEveryRank) {
  TwoRanks<ReclaimDriver> e([](EngineLoopConfig& c) { c.idle_step_interval_us = 2000; });
  ASSERT_TRUE(e.error().empty()) << e.error();
  ASSERT_TRUE(e.router_gets("ready", 10s));
  ReclaimDriver& leader_driver = e.leader_driver;
  ReclaimDriver& follower_driver = e.follower_driver;

  // Only the follower has reclaimed the room: the leader sees its report, and waits.
  follower_driver.reclaim(21, 1);
  ASSERT_TRUE(wait_for([&] { return leader_driver.locked([&] { return leader_driver.seen_ranks.count(1) == 1; }); }, 5s));
  EXPECT_FALSE(leader_driver.locked([&] { return leader_driver.decided; }));
  // The leader has too: kReclaim, applied on both ranks, once.
  leader_driver.reclaim(21, 0);
  ASSERT_TRUE(wait_for([&] {
    return follower_driver.locked([&] { return !follower_driver.applied.empty(); });
  }, 5s)) << "the follower never applied the reclaim";
  EXPECT_EQ(leader_driver.locked([&] { return leader_driver.applied; }), std::vector<uint64_t>{21});
  EXPECT_EQ(follower_driver.locked([&] { return follower_driver.applied; }), std::vector<uint64_t>{21});

  e.shut_down(5s);
}

}  // namespace
}  // namespace kvferry
