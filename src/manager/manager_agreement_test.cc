// Ranks that learn of a room's failure only from their engine's agreement (issue 30, fix 3): two
// prefill and two decode managers (TP 2 to TP 2, so prefill/tp0 writes only to decode/tp0) behind
// one bootstrap service. prefill/tp0's room fails; decode/tp1 and prefill/tp1 hear nothing from
// kvferry about it. SGLang's decode and prefill then poll each room through a MIN all-reduce over
// the TP group and call failure_exception() on every rank once the MIN is Failed
// (python/sglang/srt/disaggregation/decode.py DecodeTransferQueue.pop_transferred and
// prefill.py process_disagg_prefill_inflight_queue, with poll_and_all_reduce in utils.py), which
// kvferry's backend maps onto fail_from_agreement(): the agreement-only rank must raise the
// room's true origin, code and reason (from the failure board of the bootstrap service, where
// prefill/tp0 posted it) and tell its own peers that origin, never itself.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/bootstrap.h"
#include "kvferry/manager.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

bool until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 20s) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

ManagerConfig config(Role role, uint32_t tp_rank, const std::string& bootstrap) {
  ManagerConfig c;
  c.self = {role, 0, tp_rank, 0};
  c.tp_size = 2;
  auto model = testing::load_test_model("Qwen2.5-7B");
  EXPECT_TRUE(model.ok()) << model.status().str();
  if (model.ok()) c.model = *model;
  c.page_size = 16;
  c.pool_bytes = 8ull << 20;
  c.aux_rows = 16;
  c.transport = "shm";
  c.bootstrap_address = bootstrap;
  return c;
}

struct TwoByTwo {
  std::unique_ptr<BootstrapServer> server;
  std::string bootstrap;
  std::unique_ptr<Manager> prefill[2], decode[2];
};

std::unique_ptr<TwoByTwo> make_engines() {
  auto e = std::make_unique<TwoByTwo>();
  auto server = BootstrapServer::start("127.0.0.1", 0);
  EXPECT_TRUE(server.ok());
  if (!server.ok()) return nullptr;
  e->server = std::move(server).value();
  e->bootstrap = "127.0.0.1:" + std::to_string(e->server->port());
  for (uint32_t tp = 0; tp < 2; ++tp) {
    auto p = Manager::create(config(Role::kPrefill, tp, e->bootstrap));
    EXPECT_TRUE(p.ok()) << p.status().str();
    if (!p.ok()) return nullptr;
    e->prefill[tp] = std::move(p).value();
  }
  for (uint32_t tp = 0; tp < 2; ++tp) {
    auto d = Manager::create(config(Role::kDecode, tp, e->bootstrap));
    EXPECT_TRUE(d.ok()) << d.status().str();
    if (!d.ok()) return nullptr;
    e->decode[tp] = std::move(d).value();
  }
  return e;
}

// The room on every rank: each decode rank's receiver sent its metadata (pages 1 and 2, aux row
// 3), each prefill rank's sender is past init(2). False (with a failure added) if a step failed.
bool open_room(TwoByTwo& e, uint64_t room, std::unique_ptr<Receiver> (&rx)[2], std::unique_ptr<Sender> (&tx)[2]) {
  for (int tp = 0; tp < 2; ++tp) {
    auto r = e.decode[tp]->receiver(room);
    auto s = e.prefill[tp]->sender(room);
    if (!r.ok() || !s.ok()) {
      ADD_FAILURE() << "tp" << tp << ": " << r.status().str() << " / " << s.status().str();
      return false;
    }
    rx[tp] = std::move(r).value();
    tx[tp] = std::move(s).value();
    if (!rx[tp]->init().ok() || !rx[tp]->send_metadata(std::vector<uint64_t>{1, 2}, 3, {}).ok()) {
      ADD_FAILURE() << "decode/tp" << tp << ": metadata refused";
      return false;
    }
  }
  for (int tp = 0; tp < 2; ++tp) {
    if (!until([&] { return tx[tp]->poll() == KVPoll::WaitingForInput; }) || !tx[tp]->init(2, 0).ok()) {
      ADD_FAILURE() << "prefill/tp" << tp << ": never ready, or init refused";
      return false;
    }
  }
  return true;
}

TEST(AgreementOnlyRank, RaisesAndTellsItsPeersTheRoomsTrueOrigin) {
  auto e = make_engines();
  ASSERT_TRUE(e);
  constexpr uint64_t kRoom = 77;
  std::unique_ptr<Receiver> rx[2];
  std::unique_ptr<Sender> tx[2];
  ASSERT_TRUE(open_room(*e, kRoom, rx, tx));
  // prefill/tp0 observes a write failure of the room (as a failed UCX write would be recorded).
  tx[0]->fail(ErrorCode::kTransferError, "write to decode/tp0 failed (test)");
  ASSERT_TRUE(until([&] { return rx[0]->poll() == KVPoll::Failed; }));
  const RankId origin{Role::kPrefill, 0, 0, 0};
  EXPECT_EQ(rx[0]->failure()->origin.str(), origin.str());
  // decode/tp1 and prefill/tp1 heard nothing: their own rooms are not failed.
  EXPECT_NE(rx[1]->poll(), KVPoll::Failed);
  EXPECT_NE(tx[1]->poll(), KVPoll::Failed);

  // The engine's MIN says Failed: decode/tp1 asks what the room failed of.
  KVTransferError fallback{kRoom, ErrorCode::kAborted, "failed on another rank of this engine", e->decode[1]->self(),
                           true, monotonic_ns()};
  const KVTransferError got = rx[1]->fail_from_agreement(fallback, 10'000);
  EXPECT_EQ(got.origin.str(), origin.str()) << got.str();
  EXPECT_EQ(code_name(got.code), "transfer_error") << got.str();
  EXPECT_EQ(got.failure_reason, "write to decode/tp0 failed (test)");
  EXPECT_TRUE(got.is_from_another_rank);
  EXPECT_EQ(rx[1]->poll(), KVPoll::Failed);
  EXPECT_EQ(rx[1]->failure()->origin.str(), origin.str());
  // decode/tp1 told its source, prefill/tp1, the true origin (not itself).
  ASSERT_TRUE(until([&] { return tx[1]->poll() == KVPoll::Failed; }));
  EXPECT_EQ(tx[1]->failure()->origin.str(), origin.str()) << tx[1]->failure()->str();
  EXPECT_EQ(tx[1]->failure()->code, ErrorCode::kTransferError);
  // prefill/tp1's own call (its engine's MIN) now returns the failure it already has, at once.
  EXPECT_EQ(tx[1]->fail_from_agreement(fallback, 10'000).origin.str(), origin.str());
  // Every room ends release-safe.
  for (int tp = 0; tp < 2; ++tp)
    EXPECT_TRUE(until([&] { return rx[tp]->release_safe() && tx[tp]->release_safe(); })) << "tp" << tp;
}

// A prefill rank aborts a room still in its bootstrap queue (before init(), as SGLang's prefill
// does for a request it drops there): no kvferry message names the room, and its failure record
// has no wall clock yet (it never reached the registry). It is posted all the same (attack B1: the
// board refused it for the missing wall_ns, and every other rank named itself).
TEST(AgreementOnlyRank, LearnsAPrefillAbortBeforeInit) {
  auto e = make_engines();
  ASSERT_TRUE(e);
  constexpr uint64_t kRoom = 79;
  auto tx = e->prefill[0]->sender(kRoom).value();
  tx->abort("dropped from the bootstrap queue (test)");
  auto rx = e->decode[1]->receiver(kRoom).value();
  ASSERT_TRUE(rx->init().ok());
  KVTransferError fallback{kRoom, ErrorCode::kAborted, "failed on another rank of this engine", e->decode[1]->self(),
                           true, monotonic_ns()};
  const KVTransferError got = rx->fail_from_agreement(fallback, 10'000);
  EXPECT_EQ(got.origin.str(), "prefill/tp0") << got.str();
  EXPECT_EQ(got.failure_reason, "dropped from the bootstrap queue (test)");
  EXPECT_TRUE(got.is_from_another_rank);
}

// Two pairs fail the room independently (attack B2): prefill/tp0's write fails and decode/tp1
// aborts, back to back. Each pair hears only its own failure; the engine's MIN is Failed on both
// engines. Every rank's fail_from_agreement() must end with the one root cause (prefill/tp0's: the
// earlier, or the same 5 ms bucket and prefill first), which the board holds.
TEST(AgreementOnlyRank, TwoPairsFailingIndependentlyEndWithOneRootCause) {
  auto e = make_engines();
  ASSERT_TRUE(e);
  constexpr uint64_t kRoom = 80;
  std::unique_ptr<Receiver> rx[2];
  std::unique_ptr<Sender> tx[2];
  ASSERT_TRUE(open_room(*e, kRoom, rx, tx));
  tx[0]->fail(ErrorCode::kTransferError, "write to decode/tp0 failed (test)");
  rx[1]->abort("aborted by the engine (test)");
  ASSERT_TRUE(until([&] { return rx[0]->poll() == KVPoll::Failed && tx[1]->poll() == KVPoll::Failed; }));
  EXPECT_EQ(tx[1]->failure()->origin.str(), "decode/tp1");  // each pair knows only its own
  // The origins' posts landed (the board answers prefill/tp0's record, the rule's winner).
  BootstrapClient board(e->bootstrap, 2000, nullptr);
  ASSERT_TRUE(until([&] {
    auto r = board.lookup_failure(kRoom);
    return r.ok() && r->has_value() && (*r)->origin.str() == "prefill/tp0";
  }));
  KVTransferError fallback{kRoom, ErrorCode::kAborted, "failed on another rank of this engine", {}, true, monotonic_ns()};
  for (int tp = 0; tp < 2; ++tp) {
    for (auto got : {tx[tp]->fail_from_agreement(fallback, 1000), rx[tp]->fail_from_agreement(fallback, 1000)}) {
      EXPECT_EQ(got.origin.str(), "prefill/tp0") << "tp" << tp << ": " << got.str();
      EXPECT_EQ(code_name(got.code), "transfer_error") << "tp" << tp << ": " << got.str();
    }
  }
  EXPECT_FALSE(tx[0]->failure()->is_from_another_rank);  // the root cause's origin
  EXPECT_TRUE(rx[1]->failure()->is_from_another_rank);   // its own abort lost to it
}

// fail_from_engine() keeps the record whole: its wall_ns decides the root-cause rule (the handle
// dropped it, so the rule fell back to comparing CLOCK_MONOTONIC stamps of different hosts and a
// rank kept another record than the failure board; attack B2').
TEST(AgreementOnlyRank, AnEngineRecordIsComparedByItsWallClock) {
  auto e = make_engines();
  ASSERT_TRUE(e);
  constexpr uint64_t kRoom = 81;
  auto rx = e->decode[0]->receiver(kRoom).value();
  ASSERT_TRUE(rx->init().ok());
  ASSERT_TRUE(rx->send_metadata(std::vector<uint64_t>{1}, 2, {}).ok());
  rx->abort("aborted here (test)");
  // Another host's record: an early monotonic stamp (its boot was long ago), a wall clock a second later.
  KVTransferError later{kRoom, ErrorCode::kTransferError, "later, elsewhere", RankId{Role::kPrefill, 0, 1, 0}, true, 1};
  later.wall_ns = realtime_ns() + 1'000'000'000;
  rx->fail_from_engine(later);
  EXPECT_EQ(rx->failure()->origin.str(), "decode/tp0") << rx->failure()->str();
}

TEST(AgreementOnlyRank, WithoutARecordOnTheBoardTheFallbackIsFromAnotherRank) {
  auto e = make_engines();
  ASSERT_TRUE(e);
  constexpr uint64_t kRoom = 78;
  auto rx = e->decode[1]->receiver(kRoom).value();
  ASSERT_TRUE(rx->init().ok());
  ASSERT_TRUE(rx->send_metadata(std::vector<uint64_t>{4}, 5, {}).ok());
  KVTransferError fallback{kRoom, ErrorCode::kAborted, "failed on another rank of this engine", e->decode[1]->self(),
                           true, monotonic_ns()};
  // Nothing was posted for the room: after the wait, the fallback, as from another rank.
  const KVTransferError got = rx->fail_from_agreement(fallback, 50);
  EXPECT_EQ(got.code, ErrorCode::kAborted);
  EXPECT_EQ(got.failure_reason, "failed on another rank of this engine");
  EXPECT_TRUE(got.is_from_another_rank);
  EXPECT_EQ(rx->poll(), KVPoll::Failed);
}

// One wait in vain (a room whose record never came) does not cut the next wait short: a post that
// is merely late on a busy host (here 100 ms, beyond the 25 ms of the quiet window) still gives
// the next room its true origin. Three vain waits in a row do shorten the next (an engine whose
// failures are never posted is not stalled room after room). Before the fix one vain wait started
// the quiet window and a fresh-clone `make test` saw an agreement-only rank fall back to itself.
TEST(AgreementOnlyRank, OneWaitInVainDoesNotCutTheNextWaitShort) {
  auto e = make_engines();
  ASSERT_TRUE(e);
  auto receiver = [&](uint64_t room) {
    auto rx = e->decode[1]->receiver(room).value();
    EXPECT_TRUE(rx->init().ok());
    EXPECT_TRUE(rx->send_metadata(std::vector<uint64_t>{4}, 5, {}).ok());
    return rx;
  };
  auto fallback = [&](uint64_t room) {
    return KVTransferError{room, ErrorCode::kAborted, "failed on another rank of this engine", e->decode[1]->self(),
                           true, monotonic_ns()};
  };
  auto a = receiver(90);
  EXPECT_EQ(a->fail_from_agreement(fallback(90), 100).origin.str(), "decode/tp1");  // nothing posted: in vain
  auto b = receiver(91);
  Failure posted{ErrorCode::kTransferError, RankId{Role::kPrefill, 0, 0, 0}, "write failed (test)", monotonic_ns(),
                 realtime_ns()};
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    BootstrapClient board(e->bootstrap, 2000, nullptr);
    EXPECT_TRUE(board.post_failure(91, posted).ok());
  });
  const KVTransferError got = b->fail_from_agreement(fallback(91), 10'000);
  late.join();
  EXPECT_EQ(got.origin.str(), "prefill/tp0") << got.str();
  EXPECT_EQ(got.code, ErrorCode::kTransferError);
  // Three vain waits in a row (the record found reset the count): the next wait is short.
  for (uint64_t room : {92, 93, 95}) {
    auto rx = receiver(room);
    EXPECT_EQ(rx->fail_from_agreement(fallback(room), 100).origin.str(), "decode/tp1");
  }
  auto c = receiver(94);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c->fail_from_agreement(fallback(94), 60'000).origin.str(), "decode/tp1");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "the 60 s wait was not shortened";
  // A room that failed on this rank: its one look at the board finds the rank's own record. That
  // says nothing of the rooms whose records never come, so the window stays (attack on stop 41:
  // SGLang asks for every failed room, and each own record used to end the window).
  auto own = receiver(96);
  own->abort("aborted here (test)");
  BootstrapClient board(e->bootstrap, 2000, nullptr);
  ASSERT_TRUE(until([&] {
    auto r = board.lookup_failure(96);
    return r.ok() && r->has_value();
  }));
  EXPECT_EQ(own->fail_from_agreement(fallback(96), 1000).origin.str(), "decode/tp1");
  auto d = receiver(97);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(d->fail_from_agreement(fallback(97), 60'000).origin.str(), "decode/tp1");
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 30s) << "the room failed here ended the quiet window";
}

}  // namespace
}  // namespace kvferry
