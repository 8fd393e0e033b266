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
#include "manager/manager_drain_test_util.h"
#include "manager/manager_pair_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using namespace kvferry::testing;

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

}  // namespace
}  // namespace kvferry
