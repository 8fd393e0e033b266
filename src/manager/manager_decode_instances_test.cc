// One prefill instance serving several decode instances (1PxD; docs/manager.md "Several decode
// instances"): a prefill engine (TP1, or TP2) and decode engines with their own ranks and distinct
// engine_ids (ManagerConfig::self.engine_id), all Managers in one process over real sockets and
// one bootstrap service: interleaved rooms of two instances with every byte verified; a killed
// decode instance fails only its rooms at prefill (peer_unreachable, origin its rank) while the
// other's succeed; metadata for a room from another instance is refused and changes nothing; the
// bound on instances (max_decode_instances) and an idle dead instance forgotten; an instance of
// another TP size refused (the compatibility fingerprint).
//
// Before issue 34d a prefill rank admitted decode ranks of engine 0 only, so the ranks of a second
// decode engine were refused (and with the same engine_id they claimed to be a restart of the
// first instance's ranks).
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

uint64_t refusals(const Manager& m, const std::string& kind) {
  for (const auto& [name, n] : m.stats().refusals)
    if (name == kind) return n;
  return 0;
}

// A prefill engine of `tp` ranks and decode engines of `tp` ranks each, with progress threads.
struct Cluster {
  std::unique_ptr<BootstrapServer> server;
  std::string bootstrap;
  std::string transport;
  uint32_t tp = 1;
  std::vector<std::unique_ptr<Manager>> prefill;               // by TP rank
  std::vector<std::vector<std::unique_ptr<Manager>>> decodes;  // by instance, then TP rank
  std::vector<uint32_t> engines;                               // each instance's engine_id

  ManagerConfig config(Role role, uint32_t engine, uint32_t t) const {
    ManagerConfig c = base_config(role, transport, true);
    c.self = {role, engine, t, 0};
    c.tp_size = tp;
    c.peer_tp_size = tp;
    c.bootstrap_address = bootstrap;
    return c;
  }
  uint64_t prefill_peers() const {
    uint64_t n = 0;
    for (const auto& p : prefill) n += p->stats().peers;
    return n;
  }
  // A decode instance with engine_id `engine`; its ranks' pool registrations reached the prefill
  // ranks when `wait` (each prefill rank has as many more peers).
  bool add_decode(uint32_t engine, bool wait = true) {
    const uint64_t before = prefill_peers();
    std::vector<std::unique_ptr<Manager>> ranks;
    for (uint32_t t = 0; t < tp; ++t) {
      auto d = Manager::create(config(Role::kDecode, engine, t));
      EXPECT_TRUE(d.ok()) << d.status().str();
      if (!d.ok()) return false;
      ranks.push_back(std::move(d).value());
    }
    decodes.push_back(std::move(ranks));
    engines.push_back(engine);
    if (!wait) return true;
    const bool ok = wait_until([&] { return prefill_peers() == before + tp; });
    EXPECT_TRUE(ok) << "decode instance " << engine << ": its registrations never reached the prefill ranks ("
                    << prefill_peers() << " peers, " << refusals(*prefill[0], "outside_plan") << " refused outside the plan)";
    return ok;
  }
};

std::unique_ptr<Cluster> make_cluster(uint32_t tp, const std::string& transport, const std::vector<uint32_t>& engines,
                                      const std::function<void(ManagerConfig&)>& tweak_prefill = {}) {
  auto c = std::make_unique<Cluster>();
  c->tp = tp;
  c->transport = transport;
  auto server = BootstrapServer::start("127.0.0.1", 0);
  EXPECT_TRUE(server.ok());
  if (!server.ok()) return nullptr;
  c->server = std::move(server).value();
  c->bootstrap = "127.0.0.1:" + std::to_string(c->server->port());
  for (uint32_t t = 0; t < tp; ++t) {
    ManagerConfig pc = c->config(Role::kPrefill, 0, t);
    if (tweak_prefill) tweak_prefill(pc);
    auto p = Manager::create(pc);
    EXPECT_TRUE(p.ok()) << p.status().str();
    if (!p.ok()) return nullptr;
    c->prefill.push_back(std::move(p).value());
  }
  for (uint32_t e : engines)
    if (!c->add_decode(e)) return nullptr;
  return c;
}

// One room: its decode instance, pages and handles (one per TP rank on each side).
struct TestRoom {
  uint64_t id = 0;
  size_t instance = 0;
  std::vector<uint64_t> src, dst;
  uint64_t aux = 0;
  std::vector<std::unique_ptr<Receiver>> rx;
  std::vector<std::unique_ptr<Sender>> tx;
};

// Every rank of the room's decode instance asks for it (receiver, init, metadata).
void ask(Cluster& c, TestRoom& r, size_t instance) {
  for (auto& d : c.decodes[instance]) {
    auto rx = d->receiver(r.id);
    ASSERT_TRUE(rx.ok()) << rx.status().str();
    ASSERT_TRUE((*rx)->init(-1).ok());
    ASSERT_TRUE((*rx)->send_metadata(r.dst, r.aux, {}).ok());
    r.rx.push_back(std::move(rx).value());
  }
}

// Every prefill rank opens its sender and waits for the metadata (SGLang's order).
void open(Cluster& c, TestRoom& r) {
  for (auto& p : c.prefill) {
    auto tx = p->sender(r.id);
    ASSERT_TRUE(tx.ok()) << tx.status().str();
    r.tx.push_back(std::move(tx).value());
  }
  for (auto& tx : r.tx)
    ASSERT_TRUE(wait_until([&] { return tx->poll() == KVPoll::WaitingForInput; })) << "room " << r.id << ": "
                                                                              << to_string(tx->poll());
}

void send(Cluster& c, TestRoom& r) {
  for (size_t t = 0; t < c.prefill.size(); ++t) {
    fill(*c.prefill[t], r.id, 0, r.src);
    ASSERT_TRUE(r.tx[t]->init(r.src.size(), 0).ok());
    ASSERT_TRUE(r.tx[t]->send(r.src, {}, true).ok());
  }
}

// Every rank of the room's instance got the room, byte for byte.
void expect_arrived(Cluster& c, TestRoom& r) {
  for (size_t t = 0; t < r.rx.size(); ++t) {
    Receiver& rx = *r.rx[t];
    ASSERT_TRUE(wait_until([&] { return rx.poll() == KVPoll::Success; }))
        << "room " << r.id << " of instance " << c.engines[r.instance] << " tp" << t << ": " << to_string(rx.poll())
        << (rx.failure() ? ": " + rx.failure()->str() : "");
    EXPECT_EQ(mismatched(*c.decodes[r.instance][t], r.id, r.dst), 0u) << "room " << r.id << " tp" << t;
  }
  for (auto& tx : r.tx) EXPECT_TRUE(wait_until([&] { return tx->poll() == KVPoll::Success && tx->release_safe(); }));
}

class DecodeInstances : public ::testing::TestWithParam<std::tuple<uint32_t, std::string>> {};

// Regression (issue 33 F1, issue 34 item 1): the second decode instance's ranks were refused.
TEST_P(DecodeInstances, InterleavedRoomsOfTwoInstancesArriveByteForByte) {
  auto [tp, transport] = GetParam();
  auto c = make_cluster(tp, transport, {0, 7});
  ASSERT_TRUE(c);
  for (auto& p : c->prefill) {
    EXPECT_EQ(p->stats().peers, 2u) << "each instance's rank is its own peer";
    EXPECT_EQ(p->stats().decode_instances, 2u);
  }
  const size_t rooms = 8;
  std::vector<TestRoom> rs(rooms);
  for (size_t k = 0; k < rooms; ++k) {
    TestRoom& r = rs[k];
    r.id = 7000 + 13 * k;
    r.instance = k % 2;
    r.src = {2 * k, 2 * k + 1};            // prefill pages: one pool for both instances' rooms
    r.dst = {2 * (k / 2) + 1, 2 * (k / 2)};  // each instance's own pages
    r.aux = k / 2;
    ASSERT_NO_FATAL_FAILURE(ask(*c, r, r.instance));
  }
  for (TestRoom& r : rs) ASSERT_NO_FATAL_FAILURE(open(*c, r));
  for (size_t k = rooms; k-- > 0;) ASSERT_NO_FATAL_FAILURE(send(*c, rs[k]));
  for (TestRoom& r : rs) ASSERT_NO_FATAL_FAILURE(expect_arrived(*c, r));
  for (const auto& p : c->prefill) EXPECT_EQ(refusals(*p, "foreign"), 0u);
}

INSTANTIATE_TEST_SUITE_P(OnePrefill, DecodeInstances,
                         ::testing::Values(std::make_tuple(uint32_t{1}, std::string("shm")),
                                           std::make_tuple(uint32_t{1}, std::string("tcp")),
                                           std::make_tuple(uint32_t{2}, std::string("shm"))));

// A decode instance killed while rooms of both instances wait for their data (metadata in, no
// send yet): at prefill only its rooms fail, peer_unreachable with its rank as the origin; the
// other instance's rooms then go end to end.
TEST(DecodeInstancesDeath, AKilledInstanceFailsOnlyItsRooms) {
  auto c = make_cluster(1, "shm", {3, 9});
  ASSERT_TRUE(c);
  std::vector<TestRoom> rs(4);
  for (size_t k = 0; k < rs.size(); ++k) {
    rs[k].id = 4200 + k;
    rs[k].instance = k % 2;
    rs[k].src = {k};
    rs[k].dst = {k / 2};
    rs[k].aux = k / 2;
    ASSERT_NO_FATAL_FAILURE(ask(*c, rs[k], rs[k].instance));
    ASSERT_NO_FATAL_FAILURE(open(*c, rs[k]));
  }
  // Killed: it tells nobody. A killed process's handles never run their destructors (which would
  // abort the rooms): they are kept, never used, where leak checkers still reach them.
  // (The vector itself is never freed either: a static vector is destroyed before LeakSanitizer
  // looks, which would leave the handles unreachable.)
  static auto* graveyard = new std::vector<Receiver*>();
  for (TestRoom& r : rs)
    if (r.instance == 0)
      for (auto& rx : r.rx) graveyard->push_back(rx.release());
  c->decodes[0].clear();
  for (TestRoom& r : rs) {
    if (r.instance != 0) continue;
    Sender& tx = *r.tx[0];
    ASSERT_TRUE(wait_until([&] { return tx.poll() == KVPoll::Failed; })) << "room " << r.id;
    auto f = tx.failure();
    ASSERT_TRUE(f);
    EXPECT_EQ(f->code, ErrorCode::kPeerUnreachable) << f->str();
    EXPECT_EQ(f->origin, (RankId{Role::kDecode, 3, 0, 0})) << f->str();
    EXPECT_TRUE(wait_until([&] { return tx.release_safe(); })) << "room " << r.id;
  }
  for (TestRoom& r : rs) {
    if (r.instance != 1) continue;
    EXPECT_EQ(r.tx[0]->poll(), KVPoll::WaitingForInput) << "room " << r.id << " of the live instance";
    ASSERT_NO_FATAL_FAILURE(send(*c, r));
    ASSERT_NO_FATAL_FAILURE(expect_arrived(*c, r));
  }
}

// A room bound to instance A (its metadata accepted first): instance B's metadata for the same
// room id is refused (counted as foreign) and changes nothing; A's room goes end to end.
TEST(DecodeInstancesBinding, MetadataFromAnotherInstanceIsRefused) {
  auto c = make_cluster(1, "shm", {1, 2});
  ASSERT_TRUE(c);
  TestRoom r;
  r.id = 31337;
  r.instance = 0;
  r.src = {5, 6};
  r.dst = {2, 3};
  r.aux = 1;
  ASSERT_NO_FATAL_FAILURE(ask(*c, r, 0));
  ASSERT_NO_FATAL_FAILURE(open(*c, r));
  const uint64_t foreign = refusals(*c->prefill[0], "foreign");
  TestRoom intruder;
  intruder.id = r.id;
  intruder.dst = {0, 1};
  intruder.aux = 0;
  ASSERT_NO_FATAL_FAILURE(ask(*c, intruder, 1));
  ASSERT_TRUE(wait_until([&] { return refusals(*c->prefill[0], "foreign") > foreign; }))
      << "instance 2's metadata for instance 1's room is refused";
  EXPECT_EQ(r.tx[0]->poll(), KVPoll::WaitingForInput) << "the refused metadata changed nothing";
  EXPECT_FALSE(r.tx[0]->failure());
  // The late instance is told at once why its room is not served (issue 33's second attack,
  // finding 3: it waited out its waiting deadline, blaming itself): a terminal failure, origin the
  // prefill rank, long before any deadline (waiting_timeout is 300 s by default).
  ASSERT_TRUE(wait_until([&] { return intruder.rx[0]->poll() == KVPoll::Failed; }))
      << "the late instance's room is not failed";
  auto e = intruder.rx[0]->failure();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->origin.str(), "prefill/tp0");
  EXPECT_EQ(e->code, ErrorCode::kInvalidArgument) << e->failure_reason;
  EXPECT_TRUE(intruder.rx[0]->release_safe()) << "nothing is written to it for this room";
  EXPECT_EQ(r.tx[0]->poll(), KVPoll::WaitingForInput) << "the answer changed nothing of the room";
  ASSERT_NO_FATAL_FAILURE(send(*c, r));
  ASSERT_NO_FATAL_FAILURE(expect_arrived(*c, r));
  EXPECT_NE(intruder.rx[0]->poll(), KVPoll::Success) << "nothing was written for the intruder";
}

// A prefill with room for one decode instance: instance 4 is served, instance 5's registration
// is refused (too_many_peers, nothing kept); then instance 4 dies (no room of it) and, dead and
// idle for decode_instance_idle_ms, is forgotten. `keep_refused`: instance 5 lives on (it asks
// again every 5 s), else it is gone before instance 4 dies.
std::unique_ptr<Cluster> table_full_then_freed(bool keep_refused) {
  auto c = make_cluster(1, "shm", {4}, [](ManagerConfig& p) {
    p.max_decode_instances = 1;
    p.decode_instance_idle_ms = 300;
  });
  if (!c) return nullptr;
  Manager& prefill = *c->prefill[0];
  const uint64_t refused = refusals(prefill, "too_many_peers");
  EXPECT_TRUE(c->add_decode(5, /*wait=*/false));
  EXPECT_TRUE(wait_until([&] { return refusals(prefill, "too_many_peers") > refused; }));
  EXPECT_EQ(prefill.stats().peers, 1u) << "the refused instance's rank is not kept";
  EXPECT_EQ(prefill.stats().decode_instances, 1u);
  EXPECT_EQ(prefill.stats().forgotten_decode_instances, 0u) << "a live instance heartbeats: it is kept";
  if (!keep_refused) c->decodes[1].clear();
  c->decodes[0].clear();  // instance 4 dies; no room of it
  EXPECT_TRUE(wait_until([&] { return prefill.stats().forgotten_decode_instances == 1; }));
  return c;
}

// Sends one room of instance `instance` (its decodes index) and checks it arrived byte for byte.
void one_room(Cluster& c, uint64_t id, size_t instance) {
  TestRoom r;
  r.id = id;
  r.instance = instance;
  r.src = {1};
  r.dst = {3};
  ASSERT_NO_FATAL_FAILURE(ask(c, r, instance));
  ASSERT_NO_FATAL_FAILURE(open(c, r));
  ASSERT_NO_FATAL_FAILURE(send(c, r));
  ASSERT_NO_FATAL_FAILURE(expect_arrived(c, r));
}

// At most max_decode_instances: one more instance's registration is refused; once a known
// instance is dead and idle it is forgotten and a new instance is served.
TEST(DecodeInstancesBound, OneInstanceTooManyIsRefusedUntilADeadOneIsForgotten) {
  auto c = table_full_then_freed(/*keep_refused=*/false);
  ASSERT_TRUE(c);
  Manager& prefill = *c->prefill[0];
  EXPECT_EQ(prefill.stats().decode_instances, 0u);
  EXPECT_EQ(prefill.stats().peers, 0u);
  ASSERT_TRUE(c->add_decode(6));
  ASSERT_NO_FATAL_FAILURE(one_room(*c, 99, 2));
}

// Issue 33's second attack, finding 1: the instance refused while the table was full is not cut
// off for good. It registers again every 5 s while refused for room (decode_refusal.cc
// retry_refused), so once the dead instance is forgotten it takes the free slot and its rooms are
// served. Without the retry its rooms kept failing at once with resource_exhausted.
TEST(DecodeInstancesBound, TheRefusedInstanceIsServedOnceASlotIsFree) {
  auto c = table_full_then_freed(/*keep_refused=*/true);
  ASSERT_TRUE(c);
  Manager& prefill = *c->prefill[0];
  ASSERT_TRUE(wait_until([&] { return prefill.stats().decode_instances == 1 && prefill.stats().peers == 1; }, 60s))
      << "the refused instance never registered again";
  ASSERT_NO_FATAL_FAILURE(one_room(*c, 98, 1));
}

// Every decode instance must have the TP size the prefill was configured with (peer_tp_size): the
// sizes are in the compatibility fingerprint, so an instance of TP 2 meeting a prefill set up for
// decode TP 1 is refused at its registration (incompatible, naming the field) and kept out; the
// instance of the right size goes on.
TEST(DecodeInstancesShape, AnInstanceOfAnotherTpSizeIsRefused) {
  auto c = make_cluster(1, "shm", {1});
  ASSERT_TRUE(c);
  Manager& prefill = *c->prefill[0];
  ManagerConfig wrong = c->config(Role::kDecode, 2, 0);
  wrong.tp_size = 2;  // its tp0 only: enough to be refused
  auto d = Manager::create(wrong);
  // Decode refuses it as well once the prefill's fingerprint differs (create may already fail).
  if (d.ok()) {
    ASSERT_TRUE(wait_until([&] { return refusals(prefill, "incompatible") > 0; }));
  }
  EXPECT_EQ(prefill.stats().peers, 1u);
  EXPECT_EQ(prefill.stats().decode_instances, 1u) << "the refused instance takes no slot";
  TestRoom r;
  r.id = 4711;
  r.src = {2};
  r.dst = {5};
  ASSERT_NO_FATAL_FAILURE(ask(*c, r, 0));
  ASSERT_NO_FATAL_FAILURE(open(*c, r));
  ASSERT_NO_FATAL_FAILURE(send(*c, r));
  ASSERT_NO_FATAL_FAILURE(expect_arrived(*c, r));
}

}  // namespace
}  // namespace kvferry
