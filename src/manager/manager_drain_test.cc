// Draining and removing an instance while serving (issue 34 item 2; Manager::leave() and
// drained(), kvferry/manager.h; docs/failure-model.md "Draining and removing an instance while
// serving"), through the public API only, over a real bootstrap service and sockets. The later
// tests are regressions for issue 34's attack on leave() (findings 1, 2, 4, 5).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/bootstrap.h"
#include "kvferry/manager.h"
#include "manager/manager_drain_test_util.h"
#include "manager/manager_pair_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using namespace kvferry::testing;

TEST(ManagerDrain, APrefillInstanceLeavesWhileServing) {
  auto s = serving();
  ASSERT_TRUE(s);
  LineLog log;
  std::vector<InFlight> rooms = ask_rooms(*s, 0x5ca1e0, 2);
  ASSERT_EQ(rooms.size(), 2u);
  ASSERT_EQ(s->server->registered(), 1u);
  // Leave: no new sender, the rooms in flight go on; the entry stays until they are done.
  ASSERT_TRUE(s->prefill->leave().ok());
  EXPECT_TRUE(s->prefill->stats().leaving);
  ASSERT_TRUE(s->prefill->leave().ok());  // again: nothing more happens
  auto refused = s->prefill->sender(0x5ca1f0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("leaving"), std::string::npos) << refused.status().str();
  EXPECT_FALSE(s->prefill->drained());
  EXPECT_EQ(s->server->registered(), 1u) << "the entry went while rooms were in flight";
  finish(*s, rooms);
  for (InFlight& f : rooms) f.tx.reset();
  // No room live: the entry is removed, then drained() says so.
  ASSERT_TRUE(wait_until([&] { return s->prefill->drained(); }));
  EXPECT_EQ(s->server->registered(), 0u);
  EXPECT_EQ(s->server->deregistrations(), 1u);
  EXPECT_EQ(s->server->refused_deregistrations(), 0u);
  // A decode engine that had not found this instance yet is told it left, without waiting for its
  // lookup timeout (a minute: past it the error would be bootstrap_timeout).
  {
    ManagerConfig c = base_config(Role::kDecode, "shm", true);
    c.self.engine_id = 1;
    auto other = Manager::create(c);
    ASSERT_TRUE(other.ok()) << other.status().str();
    auto late = (*other)->receiver(0x5ca1f1, s->bootstrap);
    ASSERT_FALSE(late.ok());
    EXPECT_EQ(late.status().code(), ErrorCode::kPeerUnreachable) << late.status().str();
    EXPECT_NE(late.status().message().find("left"), std::string::npos) << late.status().str();
  }
  for (InFlight& f : rooms) f.rx.reset();
  ASSERT_EQ(s->decode->stats().prefill_instances.size(), 1u);
  // Removed: decode forgets the instance once its rank is gone, with one info line.
  s->prefill.reset();
  ASSERT_TRUE(wait_until([&] { return s->decode->stats().prefill_instances.empty(); }))
      << "decode still serves the prefill instance that left";
  EXPECT_EQ(s->decode->stats().forgotten_prefill_instances, 1u);
  EXPECT_EQ(s->decode->stats().peers, 0u);
  expect_quiet(log);
}

TEST(ManagerDrain, ADecodeInstanceLeavesWhileServing) {
  auto s = serving();
  ASSERT_TRUE(s);
  LineLog log;
  std::vector<InFlight> rooms = ask_rooms(*s, 0xdec0de0, 2);
  ASSERT_EQ(rooms.size(), 2u);
  ASSERT_EQ(s->prefill->stats().decode_instances, 1u);
  ASSERT_TRUE(s->decode->leave().ok());
  auto refused = s->decode->receiver(0xdec0df0, s->bootstrap);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("leaving"), std::string::npos) << refused.status().str();
  EXPECT_FALSE(s->decode->drained());
  finish(*s, rooms);
  for (InFlight& f : rooms) f.rx.reset();
  ASSERT_TRUE(wait_until([&] { return s->decode->drained(); }));
  for (InFlight& f : rooms) f.tx.reset();
  // The prefill instance stays registered (decode's leave removes nothing there).
  EXPECT_EQ(s->server->registered(), 1u);
  s->decode.reset();
  ASSERT_TRUE(wait_until([&] { return s->prefill->stats().decode_instances == 0; }))
      << "prefill still knows the decode instance that left";
  EXPECT_EQ(s->prefill->stats().forgotten_decode_instances, 1u);
  EXPECT_EQ(s->prefill->stats().peers, 0u);
  expect_quiet(log);
}

// Finding 1: SGLang's prefill makes a room's sender when the request arrives; the decode rank's
// receiver may come later, and a decode engine that never served this instance looks it up only
// then. A leave() in between must not fail that room in flight: the entry stays until no room is
// live. Before, leave() removed the entry at once; the decode lookup got 410 "left" and the
// prefill sender waited for metadata until its bootstrap deadline (a warning, drained() false).
TEST(ManagerDrain, ADecodeThatFindsTheInstanceAfterLeaveStillGetsItsRoom) {
  auto s = serving();
  ASSERT_TRUE(s);
  LineLog log;
  const uint64_t room = 0x1ea7e1;
  const std::vector<uint64_t> src{1, 2}, dst{7, 9};
  auto tx = s->prefill->sender(room).value();
  ASSERT_TRUE(tx->init(src.size(), 0, 32).ok());
  // A second room whose sender was made before leave() and is init()ed only after it (SGLang's
  // bootstrap queue): its metadata waits for it, it is not answered as a room with no sender.
  const uint64_t room2 = room + 1;
  const std::vector<uint64_t> src2{3}, dst2{11};
  auto tx2 = s->prefill->sender(room2).value();
  ASSERT_TRUE(s->prefill->leave().ok());
  EXPECT_EQ(s->decode->stats().prefill_instances.size(), 0u);  // not looked up yet
  auto rx = s->decode->receiver(room, s->bootstrap);
  ASSERT_TRUE(rx.ok()) << rx.status().str();
  ASSERT_TRUE((*rx)->init(-1).ok());
  ASSERT_TRUE((*rx)->send_metadata(dst, 0, {}, 32).ok());
  ASSERT_TRUE(wait_until([&] { return tx->poll() == KVPoll::WaitingForInput; })) << to_string(tx->poll());
  fill(*s->prefill, room, 0, src);
  ASSERT_TRUE(tx->send(src, {}, true).ok());
  ASSERT_TRUE(wait_until([&] { return (*rx)->poll() == KVPoll::Success && tx->poll() == KVPoll::Success; }));
  EXPECT_EQ(mismatched(*s->decode, room, dst), 0u);
  auto rx2 = s->decode->receiver(room2, s->bootstrap).value();
  ASSERT_TRUE(rx2->init(-1).ok());
  ASSERT_TRUE(rx2->send_metadata(dst2, 1, {}, 16).ok());
  ASSERT_TRUE(tx2->init(src2.size(), 1, 16).ok());
  ASSERT_TRUE(wait_until([&] { return tx2->poll() == KVPoll::WaitingForInput; })) << to_string(tx2->poll());
  fill(*s->prefill, room2, 0, src2);
  ASSERT_TRUE(tx2->send(src2, {}, true).ok());
  ASSERT_TRUE(wait_until([&] { return rx2->poll() == KVPoll::Success && tx2->poll() == KVPoll::Success; }));
  EXPECT_EQ(mismatched(*s->decode, room2, dst2), 0u);
  EXPECT_EQ(s->server->registered(), 1u);
  EXPECT_FALSE(s->prefill->drained());
  tx.reset();
  tx2.reset();
  ASSERT_TRUE(wait_until([&] { return s->prefill->drained(); }));
  EXPECT_EQ(s->server->registered(), 0u);
  EXPECT_EQ(s->server->deregistrations(), 1u);
  for (const Line& l : log.snapshot()) EXPECT_LE(l.level, LogLevel::kInfo) << l.msg;
}

// Finding 2: a receiver() whose prefill instance is being looked up (the lock released) when
// leave() is called. drained() must stay false while that call runs, and the call must not hand
// out a room after leave() returned. Before, drained() was true mid-lookup and the call then
// returned a live room, which an engine destroying the manager at drained() would free under it.
TEST(ManagerDrain, AReceiverInItsLookupWhenLeaveIsCalledIsRefused) {
  auto server = BootstrapServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().str();
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  Deadlines d = notice_only();
  d.lookup_timeout_ms = 600'000;  // the lookup retries "not registered yet" until the prefill comes
  ManagerConfig dc = base_config(Role::kDecode, "shm", true);
  dc.deadlines = d;
  auto decode = Manager::create(dc);
  ASSERT_TRUE(decode.ok()) << decode.status().str();
  auto rx = std::async(std::launch::async, [&] { return (*decode)->receiver(0x1ea7e2, address); });
  // The receiver() call is in its lookup once the service answered one (404: not registered).
  ASSERT_TRUE(wait_until([&] { return (*server)->lookups() >= 1; }));
  ASSERT_TRUE((*decode)->leave().ok());
  EXPECT_FALSE((*decode)->drained()) << "drained() while a receiver() call is still in its lookup";
  ManagerConfig pc = base_config(Role::kPrefill, "shm", true);
  pc.deadlines = d;
  pc.bootstrap_address = address;
  auto prefill = Manager::create(pc);  // registers: the lookup answers
  ASSERT_TRUE(prefill.ok()) << prefill.status().str();
  auto r = rx.get();
  ASSERT_FALSE(r.ok()) << "receiver() handed out a room after leave() returned";
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().str();
  EXPECT_NE(r.status().message().find("leaving"), std::string::npos) << r.status().str();
  EXPECT_TRUE(wait_until([&] { return (*decode)->drained(); }));
  EXPECT_EQ((*decode)->stats().live_rooms, 0u);
}

// Finding 4: the router sent a request to a prefill instance being drained. Its decode rank's
// metadata reaches a prefill rank that will never make that room's sender (sender() is refused):
// the prefill answers with a terminal failure, so the room fails at decode at once with the
// prefill rank as origin and a reason that says it is leaving, instead of an error line about a
// dead peer once the prefill's heartbeats stop.
TEST(ManagerDrain, MetadataForARoomALeavingPrefillWillNotServeFailsAtOnce) {
  auto s = serving();
  ASSERT_TRUE(s);
  LineLog log;
  // Held before leave() (or, on a slow machine, arriving after it: answered either way).
  auto held = s->decode->receiver(0x1ea7e3, s->bootstrap).value();
  ASSERT_TRUE(held->init(-1).ok());
  ASSERT_TRUE(held->send_metadata(std::vector<uint64_t>{3, 4}, 0, {}, 32).ok());
  ASSERT_TRUE(s->prefill->leave().ok());
  auto later = s->decode->receiver(0x1ea7e4, s->bootstrap).value();  // the instance is known here
  ASSERT_TRUE(later->init(-1).ok());
  ASSERT_TRUE(later->send_metadata(std::vector<uint64_t>{5, 6}, 1, {}, 32).ok());
  for (Receiver* r : {held.get(), later.get()}) {
    ASSERT_TRUE(wait_until([&] { return r->poll() == KVPoll::Failed; })) << "room " << r->room();
    const std::optional<KVTransferError> e = r->failure();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code, ErrorCode::kAborted) << e->str();
    EXPECT_EQ(e->origin, s->prefill->self()) << e->str();
    EXPECT_TRUE(e->is_from_another_rank) << e->str();
    EXPECT_NE(e->failure_reason.find("leaving"), std::string::npos) << e->str();
    EXPECT_TRUE(wait_until([&] { return r->release_safe(); })) << "room " << r->room();
  }
  held.reset();
  later.reset();
  EXPECT_TRUE(wait_until([&] { return s->prefill->drained() && s->decode->stats().live_rooms == 0; }));
  // The origin's line: a warning at the prefill rank; nothing above info at decode.
  for (const Line& l : log.snapshot()) {
    if (l.level > LogLevel::kInfo) {
      EXPECT_EQ(l.fields.origin, s->prefill->self().str()) << l.msg;
    }
  }
}

// Finding 5: heartbeats_sent is a counter (kvferry_heartbeats_sent_total): a decode rank that
// forgets a prefill instance keeps what that instance's own monitor sent (every instance but the
// first has one). Before, the sum went down when the instance went.
TEST(ManagerDrain, HeartbeatsSentNeverGoesDownWhenAnInstanceIsForgotten) {
  auto s0 = BootstrapServer::start("127.0.0.1", 0);
  auto s1 = BootstrapServer::start("127.0.0.1", 0);
  ASSERT_TRUE(s0.ok() && s1.ok());
  const std::string a0 = "127.0.0.1:" + std::to_string((*s0)->port());
  const std::string a1 = "127.0.0.1:" + std::to_string((*s1)->port());
  Deadlines d = notice_only();
  d.heartbeat_interval_ms = 20;
  d.heartbeat_timeout_ms = 2000;
  auto make = [&](Role role, const std::string& bootstrap) {
    ManagerConfig c = base_config(role, "shm", true);
    c.deadlines = d;
    c.bootstrap_address = bootstrap;
    auto m = Manager::create(c);
    EXPECT_TRUE(m.ok()) << m.status().str();
    return m.ok() ? std::move(m).value() : nullptr;
  };
  auto p0 = make(Role::kPrefill, a0);
  auto p1 = make(Role::kPrefill, a1);
  auto decode = make(Role::kDecode, "");  // no configured instance: both may be forgotten
  ASSERT_TRUE(p0 && p1 && decode);
  for (const std::string& a : {a0, a1}) {  // a0's instance: the core's monitor; a1's: its own
    auto rx = decode->receiver(a == a0 ? 0x1ea7e5 : 0x1ea7e6, a);
    ASSERT_TRUE(rx.ok()) << rx.status().str();
  }
  const uint64_t start = decode->stats().heartbeats_sent;
  ASSERT_TRUE(wait_until([&] { return decode->stats().heartbeats_sent >= start + 20; }));
  // a0 goes first: the core's monitor then heartbeats nobody, so the total moves only with a1's.
  for (auto* p : {&p0, &p1}) {
    ASSERT_TRUE((*p)->leave().ok());
    ASSERT_TRUE(wait_until([&] { return (*p)->drained(); }));
    const uint64_t before = decode->stats().heartbeats_sent;
    const uint64_t forgotten = decode->stats().forgotten_prefill_instances;
    p->reset();
    ASSERT_TRUE(wait_until([&] { return decode->stats().forgotten_prefill_instances == forgotten + 1; }));
    EXPECT_GE(decode->stats().heartbeats_sent, before) << "a counter went down";
  }
}

}  // namespace
}  // namespace kvferry
