// Rooms whose other side is not there yet, or is gone, through the public Manager
// (kvferry/manager.h) only: a decode request still waiting for memory (receiver init()ed, no
// metadata) learns prefill's failure; a sender not init()ed yet fails when its destination dies;
// a room that concluded on this rank polls Failed once its engine fails it (an engine-mate's
// failure); and each handle names its room's peers. What the replay's engine ranks (src/driver)
// rely on, as SGLang's scheduler does (docs/sglang.md).
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/log.h"
#include "manager/manager_pair_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using namespace kvferry::testing;

class ManagerRooms : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

// SGLang's decode creates the receiver and init()s it when the request arrives, and sends its
// metadata only once pages are free (the preallocation queue). A prefill failure meanwhile (here
// an abort before the sender's init) reaches the waiting request with prefill's origin, instead
// of after it found pages and sent metadata.
TEST_P(ManagerRooms, PrefillFailureReachesADecodeRequestWaitingForMemory) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto rx = r->decode->receiver(31).value();
  ASSERT_TRUE(rx->init(-1).ok());
  auto tx = r->prefill->sender(31).value();
  EXPECT_EQ(rx->poll(), KVPoll::Bootstrapping);
  tx->abort("client went away before prefill started");
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Failed; }, 20s)) << to_string(rx->poll());
  auto e = rx->failure();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kAborted);
  EXPECT_EQ(e->origin, r->prefill->self());
  EXPECT_TRUE(e->is_from_another_rank);
  EXPECT_EQ(e->failure_reason, "client went away before prefill started");
  EXPECT_TRUE(rx->release_safe()) << "no metadata went out: nothing can be written";
}

// A sender SGLang has not init()ed yet (its poll says Bootstrapping: decode's metadata has not
// come) whose decode rank dies fails then, with the dead rank as origin, rather than at its
// bootstrap deadline (an hour here); so does a sender created while that rank is down.
TEST_P(ManagerRooms, SenderBeforeInitFailsWhenItsDestinationDies) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  const RankId decode_rank = r->decode->self();
  std::mutex mu;
  std::vector<std::string> deaths;  // the death's warning (peer_dead, or connect_failed)
  set_log_callback([&](LogLevel, std::string_view, std::string_view msg, const LogFields& f) {
    for (const auto& [k, v] : f.extra)
      if (k == "event" && (v == "peer_dead" || v == "connect_failed")) {  // dead, or dead while being connected
        std::lock_guard lk(mu);
        deaths.emplace_back(msg);
      }
  });
  struct Unset {
    ~Unset() { set_log_callback({}); }
  } unset;
  auto tx = r->prefill->sender(32).value();
  EXPECT_EQ(tx->poll(), KVPoll::Bootstrapping);
  r->decode.reset();  // the decode process is gone: its heartbeats stop, its sockets refuse
  auto prefill_only = [&] {
    if (r->pumped) r->prefill->progress();
    std::vector<int> fds = r->prefill->wait_fds();
    wait_readable(fds.data(), static_cast<int>(fds.size()), 1);
  };
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (tx->poll() != KVPoll::Failed && std::chrono::steady_clock::now() < end) prefill_only();
  ASSERT_EQ(tx->poll(), KVPoll::Failed);
  auto e = tx->failure();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(e->origin, decode_rank);
  EXPECT_TRUE(e->is_from_another_rank);
  EXPECT_TRUE(tx->release_safe());
  {
    // The death's one warning names the room (issue 30 item 5), though it was not init()ed.
    std::lock_guard lk(mu);
    ASSERT_EQ(deaths.size(), 1u);
    EXPECT_NE(deaths[0].find("1 room"), std::string::npos) << deaths[0];
    EXPECT_NE(deaths[0].find("32"), std::string::npos) << deaths[0];
  }
  auto later = r->prefill->sender(33).value();
  while (later->poll() != KVPoll::Failed && std::chrono::steady_clock::now() < end) prefill_only();
  ASSERT_EQ(later->poll(), KVPoll::Failed);
  EXPECT_EQ(later->failure()->origin, decode_rank);
}

// The room succeeded on this pair of ranks; another rank of the engine failed it (SGLang: the
// TP group's MIN poll says Failed). Both handles then poll Failed with that failure, so every rank
// of the engine reports the room Failed and the engine can release it; nothing can be written.
TEST_P(ManagerRooms, ARoomThatConcludedHereFailsWithItsEngine) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto [rx, tx] = asked_room(*r, 34, {4, 5}, 2);
  ASSERT_TRUE(rx && tx);
  ASSERT_TRUE(tx->init(2, 0).ok());
  const std::vector<uint64_t> src{0, 1};
  fill(*r->prefill, 34, 0, src);
  ASSERT_TRUE(tx->send(src, {}, true).ok());
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Success && tx->poll() == KVPoll::Success; }, 20s));
  const RankId mate_d{Role::kDecode, 0, 1, 0}, mate_p{Role::kPrefill, 0, 1, 0};
  rx->fail_from_engine({34, ErrorCode::kTransferError, "a write of decode/tp1 failed", mate_d, true, monotonic_ns()});
  tx->fail_from_engine({34, ErrorCode::kInjected, "prefill/tp1 failed", mate_p, true, monotonic_ns()});
  EXPECT_EQ(rx->poll(), KVPoll::Failed);
  EXPECT_EQ(tx->poll(), KVPoll::Failed);
  ASSERT_TRUE(rx->failure());
  EXPECT_EQ(rx->failure()->origin, mate_d);
  EXPECT_TRUE(rx->failure()->is_from_another_rank);
  ASSERT_TRUE(tx->failure());
  EXPECT_EQ(tx->failure()->origin, mate_p);
  EXPECT_TRUE(rx->release_safe());
  EXPECT_FALSE(rx->quarantined());
  EXPECT_TRUE(r->until([&] { return tx->release_safe(); }, 20s));
  EXPECT_EQ(mismatched(*r->decode, 34, {4, 5}), 0u);
}

// Prefill's init() and decode's send_metadata() disagree on the room's token count (5 and 16 in
// one page): decode's check of the guard row, after every source's Success, fails the room
// (protocol_error, origin decode, both counts named). The prefill rank, whose room had concluded,
// is told and polls Failed with that cause: both engines report one failure of the room.
TEST_P(ManagerRooms, ATokenCountTheSidesDisagreeOnFailsTheRoomOnBoth) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto rx = r->decode->receiver(36).value();
  ASSERT_TRUE(rx->init(-1).ok());
  auto tx = r->prefill->sender(36).value();
  const std::vector<uint64_t> dst{4};
  ASSERT_TRUE(rx->send_metadata(dst, 3, {}, 16).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }, 20s));
  ASSERT_TRUE(tx->init(1, 0, 5).ok());
  const std::vector<uint64_t> src{0};
  fill(*r->prefill, 36, 0, src);
  ASSERT_TRUE(tx->send(src, {}, true).ok());
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Failed; }, 20s)) << to_string(rx->poll());
  auto e = rx->failure();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kProtocolError);
  EXPECT_EQ(e->origin, r->decode->self());
  EXPECT_NE(e->failure_reason.find("5 tokens"), std::string::npos) << e->failure_reason;
  EXPECT_NE(e->failure_reason.find("16 tokens"), std::string::npos) << e->failure_reason;
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed; }, 20s)) << "prefill still says " << to_string(tx->poll());
  auto pe = tx->failure();
  ASSERT_TRUE(pe);
  EXPECT_EQ(pe->code, ErrorCode::kProtocolError);
  EXPECT_EQ(pe->origin, r->decode->self());
  EXPECT_TRUE(pe->is_from_another_rank);
  EXPECT_TRUE(rx->release_safe());
}

// SGLang's prefill creates the sender when the request arrives and init()s it (then runs the
// forward) once its poll says WaitingForInput. A decode request aborted before it sent metadata
// tells the source: the sender, not init()ed yet, then polls Failed with decode's cause, so the
// engine does not run a prefill forward for a request decode gave up. Before, it polled
// WaitingForInput and learned of the failure only after init().
TEST_P(ManagerRooms, ADecodeAbortBeforeMetadataFailsASenderNotInitializedYet) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto tx = r->prefill->sender(37).value();
  auto rx = r->decode->receiver(37).value();
  ASSERT_TRUE(rx->init(-1).ok());
  rx->abort("client went away while the request waited for memory");
  ASSERT_TRUE(r->until([&] { return tx->poll() != KVPoll::Bootstrapping; }, 20s));
  EXPECT_EQ(tx->poll(), KVPoll::Failed) << "the engine would init() and run a forward for an aborted request";
  auto e = tx->failure();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kAborted);
  EXPECT_EQ(e->origin, r->decode->self());
  EXPECT_TRUE(e->is_from_another_rank);
  EXPECT_TRUE(tx->release_safe());
  tx.reset();
  rx.reset();
  EXPECT_TRUE(r->until([&] { return r->prefill->stats().live_rooms == 0 && r->decode->stats().live_rooms == 0; }, 20s));
}

// An engine that drops a sender in the middle of its room (its last send() not made) gave the
// request up: decode is told at once (aborted, origin prefill), not at its waiting deadline.
TEST_P(ManagerRooms, SenderDroppedMidRoomTellsDecode) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto [rx, tx] = asked_room(*r, 36, {4, 5, 6}, 2);
  ASSERT_TRUE(rx && tx);
  ASSERT_TRUE(tx->init(3, 0).ok());
  const std::vector<uint64_t> src{0};
  fill(*r->prefill, 36, 0, src);
  ASSERT_TRUE(tx->send(src, {}, false).ok());
  tx.reset();
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Failed; }, 20s)) << to_string(rx->poll());
  EXPECT_EQ(rx->failure()->code, ErrorCode::kAborted);
  EXPECT_EQ(rx->failure()->origin, r->prefill->self());
  EXPECT_TRUE(r->until([&] { return rx->release_safe(); }, 20s));
  EXPECT_TRUE(r->until([&] { return r->prefill->stats().live_rooms == 0; }, 20s));
}

// An engine that drops a receiver in the middle of its room: every source stops (aborted, origin
// decode), and since the handle is gone, take_reclaimed_rooms() says when the pages are free (no
// write can reach them any more).
TEST_P(ManagerRooms, ReceiverDroppedMidRoomIsNamedWhenItsPagesAreFree) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto [rx, tx] = asked_room(*r, 37, {4, 5, 6}, 2);
  ASSERT_TRUE(rx && tx);
  ASSERT_TRUE(tx->init(3, 0).ok());
  const std::vector<uint64_t> src{0};
  fill(*r->prefill, 37, 0, src);
  ASSERT_TRUE(tx->send(src, {}, false).ok());
  rx.reset();
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed; }, 20s)) << to_string(tx->poll());
  EXPECT_EQ(tx->failure()->code, ErrorCode::kAborted);
  EXPECT_EQ(tx->failure()->origin, r->decode->self());
  std::vector<uint64_t> named;
  ASSERT_TRUE(r->until([&] {
    for (uint64_t id : r->decode->take_reclaimed_rooms()) named.push_back(id);
    return !named.empty();
  }, 20s));
  EXPECT_EQ(named, std::vector<uint64_t>{37});
  EXPECT_TRUE(r->until([&] { return tx->release_safe(); }, 20s));
  EXPECT_EQ(r->decode->stats().live_rooms, 0u);
}

// fail(code, reason, observed_ns): an instant in the future, or older than kMaxObservedAgeMs,
// counts as now, so a made-up instant cannot win the root-cause rule; a recent one is kept.
TEST_P(ManagerRooms, AnObservationInstantOutsideItsWindowCountsAsNow) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  const int64_t before = monotonic_ns();
  auto a = r->prefill->sender(38).value();
  a->fail(ErrorCode::kInjected, "ancient", 1);
  auto b = r->prefill->sender(39).value();
  b->fail(ErrorCode::kInjected, "future", INT64_MAX);
  auto c = r->prefill->sender(40).value();
  c->fail(ErrorCode::kInjected, "an hour ago", before - 3'600'000'000'000);
  auto d = r->prefill->sender(41).value();
  d->fail(ErrorCode::kInjected, "a step ago", before - 2'000'000);
  const int64_t after = monotonic_ns();
  for (Sender* s : {a.get(), b.get(), c.get()}) {
    ASSERT_TRUE(s->failure());
    EXPECT_GE(s->failure()->first_seen_ns, before) << s->failure()->failure_reason;
    EXPECT_LE(s->failure()->first_seen_ns, after) << s->failure()->failure_reason;
    EXPECT_GT(s->failure()->failure().wall_ns, 0) << s->failure()->failure_reason;
  }
  ASSERT_TRUE(d->failure());
  EXPECT_EQ(d->failure()->first_seen_ns, before - 2'000'000);
}

// Each handle names its room's peers from the transfer plan (1:1 TP here); a receiver knows
// them once init() chose the prefill DP group.
TEST_P(ManagerRooms, HandlesNameTheirRoomsPeers) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto tx = r->prefill->sender(35).value();
  ASSERT_EQ(tx->peers().size(), 1u);
  EXPECT_EQ(tx->peers()[0], r->decode->self());
  auto rx = r->decode->receiver(35).value();
  EXPECT_TRUE(rx->peers().empty());
  ASSERT_TRUE(rx->init(-1).ok());
  ASSERT_EQ(rx->peers().size(), 1u);
  EXPECT_EQ(rx->peers()[0], r->prefill->self());
}

// A sender that reached Success and is then told of the room's failure (decode aborted before it
// took in prefill's Success status) polls Failed through its handle, so its failure is logged,
// once, at debug (from another rank), like any rank's that only learned of it. It was not logged
// at all: the manager's housekeeping looked at the endpoint's Success (a python_pytest flake,
// test_simultaneous_failures.py, where prefill/tp0 had an error and no line).
TEST(ManagerRoomsLogging, ASuccessFailedSinceIsLoggedOnceAtDebug) {
  std::mutex mu;
  std::vector<std::pair<std::string, LogLevel>> lines;  // prefill's failure lines of the room
  set_log_callback([&](LogLevel level, std::string_view component, std::string_view, const LogFields& f) {
    std::lock_guard lock(mu);
    if (f.room == 36u && component.find("connector") != std::string_view::npos)
      lines.push_back({std::string(component), level});
  });
  auto r = make_ranks("shm", false, notice_only(), [](ManagerConfig& c) {
    c.failure_log_component = c.self.role == Role::kPrefill ? "prefill.connector" : "decode.connector";
  });
  ASSERT_TRUE(r);
  auto tx = r->prefill->sender(36).value();
  auto rx = r->decode->receiver(36).value();
  const std::vector<uint64_t> pages{1, 2};
  ASSERT_TRUE(rx->init(-1).ok());
  ASSERT_TRUE(rx->send_metadata(pages, 3, {}).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  ASSERT_TRUE(tx->init(2, 3).ok());
  fill(*r->prefill, 36, 0, pages);
  ASSERT_TRUE(tx->send(pages, {}, true).ok());
  auto prefill_only = [&] { r->prefill->progress(); };
  ASSERT_TRUE(r->until([&] { return r->prefill->stats().live_rooms == 1 && tx->poll() == KVPoll::Success; }, 20s,
                       prefill_only));
  rx->abort("decode gives up (test)");  // before decode took in prefill's Success
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed && tx->release_safe() && rx->release_safe(); }));
  ASSERT_TRUE(tx->failure());
  EXPECT_EQ(tx->failure()->origin, r->decode->self());
  EXPECT_TRUE(tx->failure()->is_from_another_rank);
  tx.reset();
  rx.reset();
  ASSERT_TRUE(r->until([&] { return r->prefill->stats().live_rooms == 0 && r->decode->stats().live_rooms == 0; }));
  set_log_callback({});
  std::lock_guard lock(mu);
  int prefill_lines = 0, decode_lines = 0;
  for (const auto& [component, level] : lines) {
    if (component == "prefill.connector") {
      ++prefill_lines;
      EXPECT_EQ(level, LogLevel::kDebug);
    } else {
      ++decode_lines;
      EXPECT_GT(level, LogLevel::kDebug) << "decode's own abort: its origin";
    }
  }
  EXPECT_EQ(prefill_lines, 1);
  EXPECT_EQ(decode_lines, 1);
}

INSTANTIATE_TEST_SUITE_P(Transports, ManagerRooms,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_Thread" : "_Pumped");
                         });

}  // namespace
}  // namespace kvferry
