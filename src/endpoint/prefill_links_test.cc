// A transport endpoint failure is only a suspicion (docs/failure-model.md, "A transport error is
// only a suspicion"): the prefill rank judges it by the peer's control endpoint. A peer that is
// gone is dead at once (attributed to it); a peer that still accepts connections lost only its
// link: the rooms bound for it fail with this rank as origin, nobody is declared dead, and the
// link is connected again. The endpoint failure is injected (FaultInjectingTransport::
// report_peer_error) into a pair of real ranks (endpoint_pair_test_util.h), as UCX's tcp
// transport reports a socket failure ("Endpoint timeout") on a loaded host.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/endpoint_pair_steps.h"
#include "endpoint/peer_monitor.h"
#include "kvferry/fault_transport.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::decode_rank0;
using testing::make_pair;
using testing::open_room;
using testing::prefill_rank0;
using testing::transfer_room;

// The lines that carry an "event" field (peer_dead, link_lost, ...), with their level.
class EventLines {
 public:
  EventLines() {
    set_log_callback([this](LogLevel level, std::string_view, std::string_view msg, const LogFields& f) {
      for (const auto& [k, v] : f.extra) {
        if (k != "event") continue;
        std::lock_guard<std::mutex> lk(mu_);
        lines_.push_back({level, v, std::string(msg)});
      }
    });
  }
  ~EventLines() { set_log_callback({}); }
  struct Line {
    LogLevel level;
    std::string event;
    std::string msg;
  };
  std::vector<Line> of(const std::string& event) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<Line> out;
    for (const Line& l : lines_)
      if (l.event == event) out.push_back(l);
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<Line> lines_;
};

const Status kInjected(ErrorCode::kPeerUnreachable, "tcp peer 1: endpoint failed: Endpoint timeout (injected)");

// A connected pair, the log's event lines, and the prefill's transport peer of decode/tp0.
class PrefillLinks : public ::testing::Test {
 protected:
  void SetUp() override {
    p = make_pair();
    ASSERT_TRUE(p);
    auto id = p->prefill().transport_peer(decode_rank0());
    ASSERT_TRUE(id);
    pid = *id;
  }
  EventLines events;
  std::unique_ptr<testing::EndpointPair> p;
  PeerId pid = 0;
};

TEST_F(PrefillLinks, EndpointFailureOfALivePeerIsALostLinkNotADeath) {
  const int64_t t0 = monotonic_ns();
  p->pcore().faults()->report_peer_error(pid, kInjected);
  ASSERT_TRUE(p->pump_until([&] {
    auto now = p->prefill().transport_peer(decode_rank0());
    return p->prefill().links_lost() == 1 && now && *now != pid;
  }, 10s)) << "links lost " << p->prefill().links_lost();
  // Judged over the verdict window, not at the first probe.
  EXPECT_GE(monotonic_ns() - t0, PrefillEndpoint::kLinkVerdictMs * 1'000'000);
  EXPECT_TRUE(events.of("peer_dead").empty()) << events.of("peer_dead")[0].msg;
  auto lost = events.of("link_lost");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].level, LogLevel::kInfo);  // no room failed with it
  EXPECT_NE(lost[0].msg.find("decode/tp0"), std::string::npos) << lost[0].msg;
  EXPECT_NE(lost[0].msg.find("Endpoint timeout"), std::string::npos) << lost[0].msg;
  // The new connection carries a room, byte for byte.
  transfer_room(*p, 0x5a01, 48, {3, 4, 5}, 1);
  EXPECT_EQ(p->prefill().links_lost(), 1u);
  EXPECT_TRUE(events.of("peer_dead").empty());
}

TEST_F(PrefillLinks, RoomsBoundForALostLinkFailWithThisRankAsOriginAndLaterRoomsSucceed) {
  const uint64_t room = 0x5a02;
  open_room(*p, room, 48, {6, 7, 8}, 2);
  p->pcore().faults()->report_peer_error(pid, kInjected);
  ASSERT_TRUE(p->pump_until([&] {
    return p->prefill().poll(room) == KVPoll::Failed && p->decode().poll(room) == KVPoll::Failed;
  }, 10s)) << to_string(p->prefill().poll(room)) << " / " << to_string(p->decode().poll(room));
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(f->origin, prefill_rank0());
  EXPECT_FALSE(f->is_from_another_rank);
  EXPECT_NE(f->failure_reason.find("link prefill/tp0 -> decode/tp0 lost"), std::string::npos) << f->failure_reason;
  EXPECT_NE(f->failure_reason.find("still accepts"), std::string::npos) << f->failure_reason;
  auto d = p->dcore().registry().get(room);  // decode learned it: the same root cause
  ASSERT_TRUE(d);
  EXPECT_EQ(d->origin, prefill_rank0());
  EXPECT_TRUE(d->is_from_another_rank);
  EXPECT_EQ(d->failure_reason, f->failure_reason);
  EXPECT_TRUE(events.of("peer_dead").empty());
  auto lost = events.of("link_lost");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].level, LogLevel::kWarning);  // this rank is the failure's origin
  EXPECT_NE(lost[0].msg.find("1 rooms failed"), std::string::npos) << lost[0].msg;
  p->prefill().release(room);
  p->decode().release(room);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().connected_peers() == 1; }, 10s));
  transfer_room(*p, 0x5a03, 48, {3, 4, 5}, 1);
}

TEST_F(PrefillLinks, EndpointFailureOfAPeerThatIsGoneIsItsDeathAtOnce) {
  const uint64_t room = 0x5a04;
  open_room(*p, room, 48, {6, 7, 8}, 2);
  const std::string control = p->dcore().control_endpoint();
  p->kill_decode();
  // ZeroMQ closes the listening socket on its own I/O thread: wait until it refuses, as a killed
  // process's does once the kernel closed its sockets.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (PeerMonitor::probe(control, 20) != PeerMonitor::Probe::kRefused && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(PeerMonitor::probe(control, 20), PeerMonitor::Probe::kRefused) << control;
  p->pcore().faults()->report_peer_error(pid, kInjected);
  p->pump_prefill();  // one main-loop iteration: no verdict window for a refused probe
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Failed);
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(f->origin, decode_rank0());
  EXPECT_TRUE(f->is_from_another_rank);
  EXPECT_NE(f->failure_reason.find("(injected)"), std::string::npos) << f->failure_reason;
  EXPECT_EQ(events.of("peer_dead").size(), 1u);
  EXPECT_TRUE(events.of("link_lost").empty());
  EXPECT_EQ(p->prefill().links_lost(), 0u);
}

// Issue 30, fix 5: after a peer's death the one line above debug names the requests it failed
// (a bounded list, then a count), not only how many: every surviving rank's own error is rightly
// "from another rank", so this line is the only place an operator finds them.
TEST_F(PrefillLinks, PeerDeathWarningNamesTheFailedRooms) {
  const uint64_t room_a = 0x5a05, room_b = 0x5a06;
  open_room(*p, room_a, 48, {6, 7, 8}, 2);
  open_room(*p, room_b, 16, {9}, 1);
  const std::string control = p->dcore().control_endpoint();
  p->kill_decode();
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (PeerMonitor::probe(control, 20) != PeerMonitor::Probe::kRefused && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(PeerMonitor::probe(control, 20), PeerMonitor::Probe::kRefused) << control;
  p->pcore().faults()->report_peer_error(pid, kInjected);
  p->pump_prefill();
  const auto dead = events.of("peer_dead");
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].level, LogLevel::kWarning);
  EXPECT_NE(dead[0].msg.find("2 rooms failed: rooms " + std::to_string(room_a) + ", " + std::to_string(room_b)),
            std::string::npos)
      << dead[0].msg;
}

}  // namespace
}  // namespace kvferry
