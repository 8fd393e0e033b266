// A decode Manager serving rooms from several prefill instances (kvferry/manager.h receiver();
// docs/manager.md "Several prefill instances"), each prefill instance a Manager with its own
// bootstrap service, in one process over real sockets: interleaved rooms from two and three
// instances with every byte verified; one instance killed fails only its rooms (peer_unreachable,
// origin its rank, the reason naming the instance); an address that does not answer fails only the
// receivers naming it; the bound on instances, and an idle instance forgotten.
//
// The engine behaviour played here is SGLang's decode side (python/sglang/srt/disaggregation/
// common/conn.py, CommonKVReceiver.__init__: every KVReceiver names its prefill instance by
// bootstrap_addr; the manager looks an address up on the first receiver naming it
// (ensure_parallel_info) and keeps its parallel info per address (prefill_info_table); a failed
// lookup fails that receiver's room only). The ranks of the instances have the same RankId
// (prefill engine 0, tp0), as SGLang's prefill instances all have engine rank 0.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/bootstrap.h"
#include "kvferry/manager.h"
#include "manager/manager_pair_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using namespace kvferry::testing;

// n prefill instances (a Manager and a bootstrap service each) and one decode Manager with no
// configured instance: every instance is looked up by the first receiver naming it.
struct Cluster {
  std::vector<std::unique_ptr<BootstrapServer>> servers;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<Manager>> prefills;
  std::unique_ptr<Manager> decode;

  // Waits (the managers have progress threads) until pred() holds or `timeout` passed.
  static bool until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 30s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }
};

std::unique_ptr<Cluster> make_cluster(size_t n, const std::string& transport,
                                      const std::function<void(ManagerConfig&)>& tweak_decode = {}) {
  auto c = std::make_unique<Cluster>();
  for (size_t i = 0; i < n; ++i) {
    auto server = BootstrapServer::start("127.0.0.1", 0);
    EXPECT_TRUE(server.ok()) << server.status().str();
    if (!server.ok()) return nullptr;
    c->addresses.push_back("127.0.0.1:" + std::to_string((*server)->port()));
    c->servers.push_back(std::move(server).value());
    ManagerConfig pc = base_config(Role::kPrefill, transport, true);
    pc.bootstrap_address = c->addresses.back();
    auto p = Manager::create(pc);
    EXPECT_TRUE(p.ok()) << p.status().str();
    if (!p.ok()) return nullptr;
    c->prefills.push_back(std::move(p).value());
  }
  ManagerConfig dc = base_config(Role::kDecode, transport, true);
  if (tweak_decode) tweak_decode(dc);
  auto d = Manager::create(dc);
  EXPECT_TRUE(d.ok()) << d.status().str();
  if (!d.ok()) return nullptr;
  c->decode = std::move(d).value();
  return c;
}

// One room's two handles, its instance and its pages.
struct TestRoom {
  uint64_t id = 0;
  size_t instance = 0;
  std::vector<uint64_t> src, dst;
  uint64_t aux = 0;
  std::unique_ptr<Receiver> rx;
  std::unique_ptr<Sender> tx;
};

// Decode asks for the room (receiver naming its instance, init, metadata).
void ask(Cluster& c, TestRoom& r) {
  auto rx = c.decode->receiver(r.id, c.addresses[r.instance]);
  ASSERT_TRUE(rx.ok()) << rx.status().str();
  r.rx = std::move(rx).value();
  ASSERT_TRUE(r.rx->init(-1).ok());
  ASSERT_TRUE(r.rx->send_metadata(r.dst, r.aux, {}).ok());
}

// The room's prefill instance sends it (SGLang's order: init once the metadata is there).
void send(Cluster& c, TestRoom& r) {
  Manager& p = *c.prefills[r.instance];
  auto tx = p.sender(r.id);
  ASSERT_TRUE(tx.ok()) << tx.status().str();
  r.tx = std::move(tx).value();
  ASSERT_TRUE(Cluster::until([&] { return r.tx->poll() == KVPoll::WaitingForInput; }))
      << "room " << r.id << ": " << to_string(r.tx->poll());
  fill(p, r.id, 0, r.src);
  ASSERT_TRUE(r.tx->init(r.src.size(), 0).ok());
  ASSERT_TRUE(r.tx->send(r.src, {}, true).ok());
}

// The receiver's poll and failure, for a message.
std::string why(const Receiver& rx) {
  std::string out(to_string(rx.poll()));
  if (auto f = rx.failure()) out.append(": ").append(f->str());
  return out;
}

class PrefillInstances : public ::testing::TestWithParam<std::tuple<size_t, std::string>> {};

// Regression (issue 34 item 1): a decode manager refused a receiver naming a second prefill
// instance (kInvalidArgument, "one prefill instance per decode manager for now").
TEST_P(PrefillInstances, InterleavedRoomsFromEveryInstanceArriveByteForByte) {
  auto [n, transport] = GetParam();
  auto c = make_cluster(n, transport);
  ASSERT_TRUE(c);
  // 8 rooms of 2 pages, round-robin over the instances: decode pages 2k, 2k+1; each instance's
  // source pages 2j, 2j+1 for its j-th room.
  const size_t rooms = 8;
  ASSERT_GE(c->decode->layout().num_pages, 2 * rooms);
  std::vector<TestRoom> rs(rooms);
  std::vector<uint64_t> per_instance(n, 0);
  for (size_t k = 0; k < rooms; ++k) {
    TestRoom& r = rs[k];
    r.id = 5000 + 7 * k;
    r.instance = k % n;
    const uint64_t j = per_instance[r.instance]++;
    r.src = {2 * j, 2 * j + 1};
    r.dst = {2 * k + 1, 2 * k};
    r.aux = k;
    ASSERT_NO_FATAL_FAILURE(ask(*c, r));
  }
  ManagerStats s = c->decode->stats();
  ASSERT_EQ(s.prefill_instances.size(), n);
  EXPECT_EQ(s.peers, n) << "one source rank per instance, the same RankId in each";
  for (const auto& inst : s.prefill_instances) {
    EXPECT_EQ(inst.peers, 1u);
    for (size_t i = 0; i < n; ++i) {
      if (c->addresses[i] == inst.bootstrap) {
        EXPECT_EQ(inst.rooms, per_instance[i]) << inst.bootstrap;
      }
    }
  }
  // Interleaved: the instances send in turn, in reverse order of the asks.
  for (size_t k = rooms; k-- > 0;) ASSERT_NO_FATAL_FAILURE(send(*c, rs[k]));
  for (TestRoom& r : rs) {
    ASSERT_TRUE(Cluster::until([&] { return r.rx->poll() == KVPoll::Success; }))
        << "room " << r.id << " of instance " << r.instance << ": "
        << why(*r.rx);
    EXPECT_EQ(mismatched(*c->decode, r.id, r.dst), 0u) << "room " << r.id;
    EXPECT_FALSE(r.rx->failure());
    EXPECT_TRUE(Cluster::until([&] { return r.tx->poll() == KVPoll::Success && r.tx->release_safe(); }));
  }
  for (TestRoom& r : rs) {
    r.rx.reset();
    r.tx.reset();
  }
  EXPECT_TRUE(Cluster::until([&] { return c->decode->stats().live_rooms == 0; }));
  for (const auto& inst : c->decode->stats().prefill_instances) EXPECT_EQ(inst.rooms, 0u) << inst.bootstrap;
}

INSTANTIATE_TEST_SUITE_P(Instances, PrefillInstances,
                         ::testing::Values(std::make_tuple(size_t{2}, std::string("shm")),
                                           std::make_tuple(size_t{3}, std::string("shm")),
                                           std::make_tuple(size_t{2}, std::string("tcp"))));

// One prefill instance is killed while rooms of both wait for their data: only its rooms fail,
// with peer_unreachable and its rank as the origin (the reason names the instance); the other
// instance's rooms, sent after that, arrive byte for byte.
TEST(PrefillInstancesDeath, AKilledInstanceFailsOnlyItsRooms) {
  auto c = make_cluster(2, "shm");
  ASSERT_TRUE(c);
  std::vector<TestRoom> rs(4);
  for (size_t k = 0; k < rs.size(); ++k) {
    rs[k].id = 900 + k;
    rs[k].instance = k % 2;
    rs[k].src = {k / 2};
    rs[k].dst = {k};
    rs[k].aux = k;
    ASSERT_NO_FATAL_FAILURE(ask(*c, rs[k]));
  }
  for (TestRoom& r : rs) ASSERT_TRUE(Cluster::until([&] { return r.rx->poll() == KVPoll::WaitingForInput; }));
  // Instance 0 holds the metadata of its rooms, no sender yet: killed, it tells nobody.
  c->prefills[0].reset();
  for (TestRoom& r : rs) {
    if (r.instance != 0) continue;
    ASSERT_TRUE(Cluster::until([&] { return r.rx->poll() == KVPoll::Failed; })) << "room " << r.id;
    auto f = r.rx->failure();
    ASSERT_TRUE(f);
    EXPECT_EQ(f->code, ErrorCode::kPeerUnreachable) << f->str();
    EXPECT_EQ(f->origin, (RankId{Role::kPrefill, 0, 0, 0})) << f->str();
    EXPECT_NE(f->failure_reason.find(c->addresses[0]), std::string::npos) << "the reason names the instance: " << f->str();
  }
  ManagerStats s = c->decode->stats();
  ASSERT_EQ(s.prefill_instances.size(), 2u);
  for (const auto& inst : s.prefill_instances)
    EXPECT_EQ(inst.dead_peers, inst.bootstrap == c->addresses[0] ? 1u : 0u) << inst.bootstrap;
  // The other instance's rooms have not failed, and complete now.
  for (TestRoom& r : rs) {
    if (r.instance != 1) continue;
    EXPECT_EQ(r.rx->poll(), KVPoll::WaitingForInput) << "room " << r.id;
    ASSERT_NO_FATAL_FAILURE(send(*c, r));
    ASSERT_TRUE(Cluster::until([&] { return r.rx->poll() == KVPoll::Success; }))
        << "room " << r.id << ": "
        << why(*r.rx);
    EXPECT_EQ(mismatched(*c->decode, r.id, r.dst), 0u);
  }
  // The dead instance's rooms become release-safe (its process is gone).
  for (TestRoom& r : rs) {
    if (r.instance == 0) {
      EXPECT_TRUE(Cluster::until([&] { return r.rx->release_safe(); })) << "room " << r.id;
    }
  }
}

// An address where no bootstrap service answers: the receivers naming it (two at once: they
// share its one lookup) get the lookup's error; a room of a live instance, asked while that lookup
// runs, goes end to end; the next receiver naming the address looks it up again.
TEST(PrefillInstancesLookup, AnAddressThatDoesNotAnswerFailsOnlyTheReceiversNamingIt) {
  auto c = make_cluster(1, "shm", [](ManagerConfig& d) { d.deadlines.lookup_timeout_ms = 1500; });
  ASSERT_TRUE(c);
  std::string silent;
  {
    auto gone = BootstrapServer::start("127.0.0.1", 0);
    ASSERT_TRUE(gone.ok());
    silent = "127.0.0.1:" + std::to_string((*gone)->port());
  }  // stopped: its port refuses
  Status first, second;
  std::thread a([&] { first = c->decode->receiver(71, silent).status(); });
  std::thread b([&] { second = c->decode->receiver(72, silent).status(); });
  TestRoom good;
  good.id = 70;
  good.src = {0, 1};
  good.dst = {3, 2};
  ASSERT_NO_FATAL_FAILURE(ask(*c, good));
  ASSERT_NO_FATAL_FAILURE(send(*c, good));
  ASSERT_TRUE(Cluster::until([&] { return good.rx->poll() == KVPoll::Success; })) << to_string(good.rx->poll());
  EXPECT_EQ(mismatched(*c->decode, good.id, good.dst), 0u);
  a.join();
  b.join();
  for (const Status& s : {first, second}) {
    EXPECT_TRUE(s.code() == ErrorCode::kBootstrapTimeout || s.code() == ErrorCode::kPeerUnreachable) << s.str();
    EXPECT_NE(s.message().find(silent), std::string::npos) << s.str();
  }
  EXPECT_FALSE(good.rx->failure());
  Status again = c->decode->receiver(73, silent).status();
  EXPECT_FALSE(again.ok());
  ManagerStats s = c->decode->stats();
  ASSERT_EQ(s.prefill_instances.size(), 1u) << "a failed lookup keeps nothing";
  EXPECT_EQ(s.prefill_instances[0].bootstrap, c->addresses[0]);
  EXPECT_EQ(s.live_rooms, 1u) << "only the good room";
}

// At most max_prefill_instances instances at once: one more is refused with kResourceExhausted,
// until an instance whose last room ended is forgotten after prefill_instance_idle_ms.
TEST(PrefillInstancesBound, OneInstanceTooManyIsRefusedUntilAnIdleOneIsForgotten) {
  auto c = make_cluster(3, "shm", [](ManagerConfig& d) {
    d.max_prefill_instances = 2;
    d.prefill_instance_idle_ms = 1;
  });
  ASSERT_TRUE(c);
  auto keep = c->decode->receiver(1, c->addresses[0]);
  ASSERT_TRUE(keep.ok()) << keep.status().str();
  auto brief = c->decode->receiver(2, c->addresses[1]);
  ASSERT_TRUE(brief.ok()) << brief.status().str();
  Status refused = c->decode->receiver(3, c->addresses[2]).status();
  EXPECT_EQ(refused.code(), ErrorCode::kResourceExhausted) << refused.str();
  EXPECT_NE(refused.message().find("max_prefill_instances 2"), std::string::npos) << refused.str();
  EXPECT_NE(refused.message().find(c->addresses[2]), std::string::npos) << refused.str();
  // Instance 1's only room ends (dropped before init: nothing to drain): it is forgotten.
  brief->reset();
  ASSERT_TRUE(Cluster::until([&] { return c->decode->stats().forgotten_prefill_instances == 1; }));
  ManagerStats s = c->decode->stats();
  ASSERT_EQ(s.prefill_instances.size(), 1u);
  EXPECT_EQ(s.prefill_instances[0].bootstrap, c->addresses[0]) << "an instance with a room is kept";
  TestRoom r;
  r.id = 3;
  r.instance = 2;
  r.src = {0};
  r.dst = {4};
  ASSERT_NO_FATAL_FAILURE(ask(*c, r));
  ASSERT_NO_FATAL_FAILURE(send(*c, r));
  ASSERT_TRUE(Cluster::until([&] { return r.rx->poll() == KVPoll::Success; })) << to_string(r.rx->poll());
  EXPECT_EQ(mismatched(*c->decode, r.id, r.dst), 0u);
}

}  // namespace
}  // namespace kvferry
