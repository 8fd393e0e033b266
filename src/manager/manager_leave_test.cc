// An orderly leave through the public Manager (kvferry/manager.h; docs/failure-model.md "Leaving"):
// a manager that is closed sends its peers a last heartbeat saying it is leaving
// (kvferry/messages.h Heartbeat::leaving). A peer rank (decode for a prefill rank, and the other
// way) that has no room in flight with it reports its loss (heartbeat timeout or transport) with
// one info line and no failure; a room still in flight fails as for any lost peer
// (it fails with origin the prefill rank, never hangs). Before, an orderly prefill shutdown
// was an error at decode once the heartbeats stopped (issue 33 attack, finding 10).
// Without the leaving heartbeat the first tests fail: no peer_left line comes, only the error
// (decode) or warning (prefill) of a peer taken for dead.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/bootstrap.h"
#include "kvferry/log.h"
#include "kvferry/manager.h"
#include "manager/manager_pair_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using namespace kvferry::testing;

struct Line {
  LogLevel level;
  std::string msg;
  LogFields fields;
  std::string event() const {
    for (const auto& [k, v] : fields.extra)
      if (k == "event") return v;
    return {};
  }
};

struct LineLog {
  std::mutex mu;
  std::vector<Line> lines;  // above debug
  LineLog() {
    set_log_callback([this](LogLevel level, std::string_view, std::string_view msg, const LogFields& f) {
      if (level <= LogLevel::kDebug) return;
      std::lock_guard lk(mu);
      lines.push_back({level, std::string(msg), f});
    });
  }
  ~LineLog() { set_log_callback({}); }
  std::vector<Line> snapshot() {
    std::lock_guard lk(mu);
    return lines;
  }
  bool has_event(const std::string& e) {
    for (const Line& l : snapshot())
      if (l.event() == e) return true;
    return false;
  }
};

class ManagerLeave : public ::testing::TestWithParam<Role> {};

TEST_P(ManagerLeave, ARankClosedInOrderIsForgottenWithOneInfoLine) {
  Deadlines d = notice_only();
  d.heartbeat_timeout_ms = 1500;  // the peer's loss is reported past it (or when its transport goes)
  auto r = make_ranks("shm", /*thread=*/true, d);
  ASSERT_TRUE(r);
  LineLog log;
  const uint64_t room = 0x1eaf;
  const std::vector<uint64_t> src{2, 7}, dst{5, 1};
  {
    auto tx = r->prefill->sender(room).value();
    auto rx = r->decode->receiver(room).value();
    ASSERT_TRUE(tx->init(src.size(), 0, 32).ok());
    ASSERT_TRUE(rx->init(-1).ok());
    ASSERT_TRUE(rx->send_metadata(dst, 3, {}, 32).ok());
    ASSERT_TRUE(wait_until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
    fill(*r->prefill, room, 0, src);
    ASSERT_TRUE(tx->send(src, {}, true).ok());
    ASSERT_TRUE(wait_until([&] { return rx->poll() == KVPoll::Success && tx->poll() == KVPoll::Success; }));
    EXPECT_EQ(mismatched(*r->decode, room, dst), 0u);
  }
  // That engine shuts down in order; the other one notices.
  (GetParam() == Role::kPrefill ? r->prefill : r->decode).reset();
  ASSERT_TRUE(wait_until([&] { return log.has_event("peer_left") || log.has_event("peer_dead"); }))
      << "the peer never noticed the rank was gone";
  std::vector<Line> lines = log.snapshot();
  ASSERT_TRUE(log.has_event("peer_left"));
  for (const Line& l : lines) EXPECT_LE(l.level, LogLevel::kInfo) << l.msg;
  size_t left = 0;
  for (const Line& l : lines) left += l.event() == "peer_left";
  EXPECT_EQ(left, 1u);
}

INSTANTIATE_TEST_SUITE_P(Closed, ManagerLeave, ::testing::Values(Role::kPrefill, Role::kDecode),
                         [](const auto& i) { return i.param == Role::kPrefill ? "prefill" : "decode"; });

TEST(ManagerLeaveInFlight, ARoomInFlightWhenPrefillLeavesFailsAsForALostPeer) {
  auto r = make_ranks("shm", /*thread=*/true, notice_only());
  ASSERT_TRUE(r);
  LineLog log;
  const uint64_t room = 0x1eb0;
  auto rx = r->decode->receiver(room).value();
  {
    auto tx = r->prefill->sender(room).value();
    ASSERT_TRUE(tx->init(2, 0, 32).ok());
    ASSERT_TRUE(rx->init(-1).ok());
    const std::vector<uint64_t> dst{4, 6};
    ASSERT_TRUE(rx->send_metadata(dst, 2, {}, 32).ok());
    ASSERT_TRUE(wait_until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  }  // the sender is closed, nothing sent
  r->prefill.reset();
  ASSERT_TRUE(wait_until([&] { return rx->poll() == KVPoll::Failed; }));
  auto e = rx->failure();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->origin.str(), "prefill/tp0");  // the sender's close or the rank's leave: prefill's, either way
}

// Joining and leaving while serving (issue 34 item 2; Manager::leave() and drained(),
// kvferry/manager.h). A prefill engine and a decode engine of one rank each, over a bootstrap
// service; decode names the prefill instance per receiver (no configured instance, so it may be
// forgotten). The idle timeouts are an hour: an instance forgotten within the test's wait is one
// forgotten because its ranks left, not for idleness.
struct Serving {
  std::unique_ptr<BootstrapServer> server;
  std::string bootstrap;
  std::unique_ptr<Manager> prefill, decode;
};

std::unique_ptr<Serving> serving() {
  auto s = std::make_unique<Serving>();
  auto server = BootstrapServer::start("127.0.0.1", 0);
  EXPECT_TRUE(server.ok()) << server.status().str();
  if (!server.ok()) return nullptr;
  s->server = std::move(server).value();
  s->bootstrap = "127.0.0.1:" + std::to_string(s->server->port());
  Deadlines d = notice_only();
  d.heartbeat_timeout_ms = 1500;
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    ManagerConfig c = base_config(role, "shm", /*thread=*/true);
    c.deadlines = d;
    c.prefill_instance_idle_ms = 3'600'000;
    c.decode_instance_idle_ms = 3'600'000;
    if (role == Role::kPrefill) c.bootstrap_address = s->bootstrap;
    auto m = Manager::create(c);
    EXPECT_TRUE(m.ok()) << m.status().str();
    if (!m.ok()) return nullptr;
    (role == Role::kPrefill ? s->prefill : s->decode) = std::move(m).value();
  }
  return s;
}

struct InFlight {
  uint64_t room;
  std::vector<uint64_t> src, dst;
  std::unique_ptr<Sender> tx;
  std::unique_ptr<Receiver> rx;
};

// Rooms asked for by decode and waiting for prefill's pages (SGLang's order: sender WaitingForInput).
std::vector<InFlight> ask_rooms(Serving& s, uint64_t first, size_t n) {
  std::vector<InFlight> rooms;
  for (size_t i = 0; i < n; ++i) {
    InFlight f{first + i, {2 * i, 2 * i + 1}, {10 + 3 * i, 11 + 3 * i}, nullptr, nullptr};
    auto rx = s.decode->receiver(f.room, s.bootstrap);
    EXPECT_TRUE(rx.ok()) << rx.status().str();
    if (!rx.ok()) return {};
    f.rx = std::move(rx).value();
    f.tx = s.prefill->sender(f.room).value();
    EXPECT_TRUE(f.rx->init(-1).ok());
    EXPECT_TRUE(f.rx->send_metadata(f.dst, i, {}, 32).ok());
    EXPECT_TRUE(f.tx->init(f.src.size(), i, 32).ok());
    rooms.push_back(std::move(f));
  }
  for (InFlight& f : rooms)
    EXPECT_TRUE(wait_until([&] { return f.tx->poll() == KVPoll::WaitingForInput; })) << "room " << f.room;
  return rooms;
}

// Sends every room's pages and waits until both sides concluded each with every byte.
void finish(Serving& s, std::vector<InFlight>& rooms) {
  for (InFlight& f : rooms) {
    fill(*s.prefill, f.room, 0, f.src);
    ASSERT_TRUE(f.tx->send(f.src, {}, true).ok());
  }
  for (InFlight& f : rooms) {
    ASSERT_TRUE(wait_until([&] { return f.rx->poll() == KVPoll::Success && f.tx->poll() == KVPoll::Success; }))
        << "room " << f.room;
    EXPECT_EQ(mismatched(*s.decode, f.room, f.dst), 0u) << "room " << f.room;
  }
}

void expect_quiet(LineLog& log) {
  for (const Line& l : log.snapshot()) EXPECT_LE(l.level, LogLevel::kInfo) << l.msg;
  EXPECT_TRUE(log.has_event("peer_left"));
}

TEST(ManagerDrain, APrefillInstanceLeavesWhileServing) {
  auto s = serving();
  ASSERT_TRUE(s);
  LineLog log;
  std::vector<InFlight> rooms = ask_rooms(*s, 0x5ca1e0, 2);
  ASSERT_EQ(rooms.size(), 2u);
  ASSERT_EQ(s->server->registered(), 1u);
  // Leave: its entry goes, no new sender, the rooms in flight go on.
  ASSERT_TRUE(s->prefill->leave().ok());
  EXPECT_TRUE(s->prefill->stats().leaving);
  EXPECT_EQ(s->server->registered(), 0u);
  EXPECT_EQ(s->server->deregistrations(), 1u);
  ASSERT_TRUE(s->prefill->leave().ok());  // again: nothing more to remove, nothing sent
  EXPECT_EQ(s->server->refused_deregistrations(), 0u);
  auto refused = s->prefill->sender(0x5ca1f0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("leaving"), std::string::npos) << refused.status().str();
  EXPECT_FALSE(s->prefill->drained());
  finish(*s, rooms);
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
  for (InFlight& f : rooms) f.tx.reset();
  ASSERT_TRUE(wait_until([&] { return s->prefill->drained(); }));
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

}  // namespace
}  // namespace kvferry
