// Issue 12 "no state without a deadline, no message without recovery", at the endpoint level
// (endpoint_pair_test_util.h: a prefill and a decode rank in one process, real sockets and UCX):
// the transfer deadline of a room whose writes never complete and what happens to its staging and
// to decode's pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include "endpoint/endpoint_pair_steps.h"
#include "kvferry/fault_transport.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::decode_rank0;
using testing::make_pair;
using testing::open_room;
using testing::PairConfig;
using testing::prefill_rank0;

bool chunk_done(const testing::EndpointPair& p, uint64_t tag, bool ok) {
  return std::any_of(p.chunks_done.begin(), p.chunks_done.end(),
                     [&](const ChunkDone& d) { return d.tag == tag && d.ok == ok; });
}

// A wedged receiver (its writes are held in flight forever): the room fails at the transfer
// deadline, with the prefill rank as origin and the destination named; decode fails at once (the
// early notice) and quarantines its pages (no terminal status while a write may land); prefill
// gives the writes up at its drain deadline, so the chunk's staging is done and the room can be
// released; when the held write completes after all, decode is told the pages are drained.
TEST(EndpointDeadlines, WedgedWritesFailAtTheTransferDeadlineAndStagingMovesOn) {
  PairConfig cfg;
  cfg.prefill_deadlines.transfer_timeout_ms = 300;
  cfg.prefill_deadlines.drain_timeout_ms = 300;
  cfg.decode_deadlines.drain_timeout_ms = 300;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x12a1;
  open_room(*p, room, 64, {4, 5, 6, 7}, 2);
  ASSERT_NE(p->pcore().faults(), nullptr);
  p->pcore().faults()->hold_room(room);
  const int64_t sent_ns = monotonic_ns();
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1, 2, 3}, 7).ok());
  const uint64_t lines0 = lines_above_debug();

  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 10s));
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, ErrorCode::kTransferError);
  EXPECT_EQ(f->origin, prefill_rank0());
  EXPECT_FALSE(f->is_from_another_rank);
  EXPECT_NE(f->failure_reason.find("decode/tp0"), std::string::npos) << f->failure_reason;
  EXPECT_NE(f->failure_reason.find("not acknowledged"), std::string::npos) << f->failure_reason;
  EXPECT_GE(f->first_seen_ns - sent_ns, 300'000'000);  // not before the deadline
  EXPECT_EQ(p->prefill().room(room)->inflight, 1u);
  EXPECT_TRUE(p->prefill().room(room)->early_failure_sent);
  EXPECT_FALSE(p->prefill().room(room)->terminal_sent);

  // Decode fails at once with the same record, but its pages stay unsafe: no terminal status.
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 5s));
  auto d = p->dcore().registry().get(room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kTransferError);
  EXPECT_EQ(d->origin, prefill_rank0());
  EXPECT_TRUE(d->is_from_another_rank);
  EXPECT_FALSE(p->decode().drained(room, monotonic_ns()));

  // Prefill: the writes are abandoned past its drain deadline; the chunk is done (not ok), so
  // the driver's staging ring frees its pages, and the room is release-safe for prefill.
  EXPECT_FALSE(chunk_done(*p, 7, false));
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().drained(room); }, 10s));
  EXPECT_TRUE(p->prefill().room(room)->abandoned);
  ASSERT_TRUE(p->pump_until([&] { return chunk_done(*p, 7, false); }, 5s));
  EXPECT_EQ(p->prefill().abandoned_writes(), 1u);
  EXPECT_FALSE(p->prefill().room(room)->terminal_sent);  // a write may still land
  EXPECT_EQ(p->pcore().faults()->queued_writes(room), 1u);

  // Decode is drained by its deadline only, not by a confirmation: its pages are quarantined.
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 10s));
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 0u);
  EXPECT_EQ(lines_above_debug(), lines0);  // endpoints log at debug; the drivers report

  p->prefill().release(room);
  EXPECT_EQ(p->prefill().abandoned_rooms(), 1u);
  // The wedge clears: the late write completes; no second ChunkDone, the drain is confirmed.
  const size_t done_before = p->chunks_done.size();
  p->pcore().faults()->release_held(room);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().abandoned_rooms() == 0; }, 5s));
  EXPECT_EQ(p->prefill().abandoned_writes_completed(), 1u);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().room(room)->terminal.count(prefill_rank0()) == 1; }, 5s));
  EXPECT_EQ(p->chunks_done.size(), done_before);
  p->decode().release(room);
}

// Rooms behind a wedged one are not held up: the next room's writes go through while the first
// is wedged and completes once released.
TEST(EndpointDeadlines, RoomsBehindAWedgedRoomSucceed) {
  PairConfig cfg;
  cfg.prefill_deadlines.transfer_timeout_ms = 60000;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t wedged = 0x12b1, next = 0x12b2;
  open_room(*p, wedged, 32, {0, 1}, 1);
  p->pcore().faults()->hold_room(wedged);
  ASSERT_TRUE(p->send_chunk(wedged, 0, {10, 11}, 1).ok());  // staging apart from the next room's
  testing::transfer_room(*p, next, 32, {4, 5}, 3);
  EXPECT_EQ(p->prefill().poll(wedged), KVPoll::Transferring);  // slow is not failed
  p->pcore().faults()->release_held(wedged);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(wedged) == KVPoll::Success; }, 5s));
  EXPECT_EQ(p->verify_decode(wedged, {0, 1}), 0u);
}

// The transfer deadline counts from the room's last write progress, not from its first send: a
// room whose writes each take a while but keep completing is not failed.
TEST(EndpointDeadlines, SlowButProgressingWritesAreNotFailed) {
  PairConfig cfg;
  cfg.prefill_deadlines.transfer_timeout_ms = 900;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x12c1;
  const std::vector<uint64_t> kv = {8, 9, 10, 11, 12, 13};
  open_room(*p, room, 96, kv, 4);
  p->pcore().faults()->delay_room(room, 150ms);
  // Each one-page chunk is sent once the previous one completed: the room's total time (six
  // chunks and the final batch, 150 ms each) exceeds the transfer deadline, no gap between
  // completions comes near it.
  for (uint64_t c = 0; c < kv.size(); ++c) {
    ASSERT_TRUE(p->send_chunk(room, c, {c}, 100 + c).ok());
    ASSERT_TRUE(p->pump_until([&] { return chunk_done(*p, 100 + c, true); }, 5s)) << "chunk " << c;
  }
  const int64_t t0 = p->prefill().room(room)->first_send_ns;
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 5s))
      << to_string(p->decode().poll(room));
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Success);
  EXPECT_GT(testing::ms_since(t0), 900);  // longer than the deadline in all
  EXPECT_EQ(p->verify_decode(room, kv), 0u);
}

// A lost Success status does not become a waiting_timeout blamed on decode: decode asks again
// (its metadata again) and the prefill rank answers with the status it sent, even once it has
// released the room (its tombstone).
TEST(EndpointDeadlines, LostSuccessStatusIsRecoveredByAskingAgain) {
  PairConfig cfg;
  cfg.decode_deadlines.status_retry_ms = 100;
  cfg.decode_deadlines.waiting_timeout_ms = 60000;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x12d1;
  const std::vector<uint64_t> kv = {2, 3, 4};
  int dropped = 0;
  p->pcore().set_send_filter([&](const std::string&, const Message& m) {
    auto* st = std::get_if<RoomStatus>(&m);
    if (!st || st->state != KVPoll::Success || dropped > 0) return true;
    ++dropped;
    return false;
  });
  open_room(*p, room, 48, kv, 1);
  const int64_t t0 = monotonic_ns();
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1, 2}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Success; }, 5s));
  ASSERT_EQ(dropped, 1);
  p->prefill().release(room);  // prefill is done with it: the answer comes from its tombstone
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 10s))
      << to_string(p->decode().poll(room));
  EXPECT_GE(p->decode().status_asks(), 1u);
  EXPECT_LT(testing::ms_since(t0), 10000);  // far from the 60 s waiting deadline
  EXPECT_EQ(p->verify_decode(room, kv), 0u);
  EXPECT_FALSE(p->dcore().registry().get(room));
}

// A lost terminal Failed status: decode learns the prefill rank's failure by asking, with its
// true origin, and is drained by the confirmation, not by a deadline.
TEST(EndpointDeadlines, LostFailureStatusKeepsItsOriginWhenAskedAgain) {
  PairConfig cfg;
  cfg.decode_deadlines.status_retry_ms = 100;
  cfg.decode_deadlines.waiting_timeout_ms = 60000;
  cfg.decode_deadlines.drain_timeout_ms = 60000;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x12d2;
  int dropped = 0;
  p->pcore().set_send_filter([&](const std::string&, const Message& m) {
    auto* st = std::get_if<RoomStatus>(&m);
    if (!st || st->state != KVPoll::Failed || dropped > 0) return true;
    ++dropped;
    return false;
  });
  open_room(*p, room, 32, {0, 1}, 1);
  p->prefill().fail(room, ErrorCode::kTransferError, "copy engine fault", prefill_rank0(), monotonic_ns(), true);
  ASSERT_EQ(dropped, 1);  // the only status this failure sends: terminal, nothing in flight
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 10s));
  auto d = p->dcore().registry().get(room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kTransferError);
  EXPECT_EQ(d->origin, prefill_rank0());
  EXPECT_EQ(d->failure_reason, "copy engine fault");
  EXPECT_TRUE(d->is_from_another_rank);
  EXPECT_GE(p->decode().status_asks(), 1u);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 5s));
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 1u);  // by confirmation
}

// Asking again is bounded and idempotent: a room still in progress at the source is asked at most
// kMaxAsks times, its first metadata stays, and the room then completes normally.
TEST(EndpointDeadlines, AskingAgainIsBoundedAndChangesNothingAtTheSource) {
  PairConfig cfg;
  cfg.decode_deadlines.status_retry_ms = 1;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x12d3;
  const std::vector<uint64_t> kv = {6, 7};
  open_room(*p, room, 32, kv, 2);
  // 1 + 2 + ... + 32 ms: every ask is made within a second.
  ASSERT_TRUE(p->pump_until([&] { return p->decode().status_asks() == DecodeEndpoint::kMaxAsks; }, 10s))
      << p->decode().status_asks();
  p->pump_for(100ms);
  EXPECT_EQ(p->decode().status_asks(), DecodeEndpoint::kMaxAsks);
  EXPECT_EQ(p->prefill().room(room)->meta.at(decode_rank0()).kv_indices, kv);
  EXPECT_EQ(p->prefill().poll(room), KVPoll::WaitingForInput);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 5s));
  EXPECT_EQ(p->verify_decode(room, kv), 0u);
}

// A connect to a peer never blocks the rank's main thread: with the transport connect held (a
// slow wire-up), every progress round returns at once and a room for that peer waits in
// Bootstrapping (not ready, not failed); once the connect completes the room goes through.
TEST(EndpointDeadlines, ConnectRunsOffTheMainThreadAndRoomsWaitForIt) {
  PairConfig cfg;
  cfg.prefill_deadlines.connect_timeout_ms = 60000;
  cfg.hold_prefill_connects = true;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->pump_until([&] { return p->pcore().faults()->held_connects() == 1; }, 5s));
  const uint64_t room = 0x12e1;
  const std::vector<uint64_t> kv = {1, 2};
  p->prefill().add_room(room, 32);
  p->decode().add_room(room, 32);
  ASSERT_TRUE(p->decode().init(room, kv, 3).ok());
  int64_t longest_ns = 0;
  auto timed = [&] {
    const int64_t t = monotonic_ns();
    p->pump();
    longest_ns = std::max(longest_ns, monotonic_ns() - t);
  };
  // The metadata arrives and is kept while the connect is under way.
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().room(room)->meta.size() == 1; }, 5s, timed));
  p->pump_for(300ms, timed);
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Bootstrapping);
  EXPECT_EQ(p->prefill().connecting_peers(), 1u);
  EXPECT_LT(longest_ns, 200'000'000) << "a progress round waited for the connect";
  p->pcore().faults()->release_connects();
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::WaitingForInput; }, 10s));
  EXPECT_EQ(p->prefill().connecting_peers(), 0u);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 5s));
  EXPECT_EQ(p->verify_decode(room, kv), 0u);
}

// A connect that does not complete within connect_timeout fails the rooms waiting for it with
// peer_unreachable naming the peer, in one line above debug; once the peer answers again it is
// connected again and new rooms succeed.
TEST(EndpointDeadlines, ConnectPastItsDeadlineFailsTheRoomsNamingThePeer) {
  PairConfig cfg;
  cfg.prefill_deadlines.connect_timeout_ms = 300;
  cfg.hold_prefill_connects = true;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->pump_until([&] { return p->pcore().faults()->held_connects() == 1; }, 5s));
  const uint64_t room = 0x12e2;
  p->prefill().add_room(room, 32);
  p->decode().add_room(room, 32);
  ASSERT_TRUE(p->decode().init(room, {4, 5}, 1).ok());
  const uint64_t lines0 = lines_above_debug();
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 10s));
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(f->origin, decode_rank0());
  EXPECT_NE(f->failure_reason.find("decode/tp0"), std::string::npos) << f->failure_reason;
  EXPECT_NE(f->failure_reason.find("300 ms"), std::string::npos) << f->failure_reason;
  EXPECT_EQ(lines_above_debug() - lines0, 1u);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 5s));
  EXPECT_EQ(p->dcore().registry().get(room)->origin, decode_rank0());
  // The held connect ends (its late result is dropped); the peer still answers, so it is
  // connected again and a new room succeeds.
  p->pcore().faults()->release_connects();
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().connected_peers() == 1; }, 10s));
  testing::transfer_room(*p, 0x12e3, 32, {6, 7}, 2);
}

// Quarantined pages are counted as leaked, not hidden, and reclaimed once the prefill rank
// confirms the drain: a wedged write keeps a failed room's pages unsafe past decode's drain
// deadline; decode releases the room quarantined; when the write completes after all, prefill's
// terminal status ends the quarantine and the room is handed back for reuse.
TEST(EndpointDeadlines, QuarantinedPagesAreCountedAndReclaimedWhenTheDrainIsConfirmed) {
  PairConfig cfg;
  cfg.decode_deadlines.drain_timeout_ms = 200;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x12f1;
  open_room(*p, room, 48, {3, 4, 5}, 2);
  p->pcore().faults()->hold_room(room);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1, 2}, 1).ok());
  p->decode().fail(room, ErrorCode::kAborted, "client went away", decode_rank0(), monotonic_ns(), true);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 10s));
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 0u);  // by the deadline
  p->decode().release(room);
  EXPECT_EQ(p->decode().quarantined_rooms(), 1u);
  EXPECT_EQ(p->decode().quarantined_pages(), 3u + 1u);  // its pages and its aux row
  EXPECT_TRUE(p->decode().take_reclaimed().empty());
  p->pump_for(50ms);
  EXPECT_EQ(p->decode().quarantined_pages(), 4u);  // nothing confirms it while the write is held

  p->pcore().faults()->release_held(room);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().reclaimed_total() == 1; }, 10s));
  EXPECT_EQ(p->decode().quarantined_rooms(), 0u);
  EXPECT_EQ(p->decode().quarantined_pages(), 0u);
  EXPECT_EQ(p->decode().take_reclaimed(), std::vector<uint64_t>{room});
  EXPECT_TRUE(p->decode().take_reclaimed().empty());
  EXPECT_EQ(p->dmanager().stats().quarantined_pages, 0u);
  EXPECT_EQ(p->dmanager().stats().reclaimed_rooms, 1u);
}

// A quarantine waiting for a source killed for good ends without a restart (issue 33 finding 10):
// while the source is only presumed dead (declared dead here, its process alive: its control
// endpoint accepts connects, its held write may still land) the pages stay quarantined; once its
// process is gone (destroyed: its control socket refuses connects) no write of it can land and the
// room is reclaimed, though no new incarnation registered.
TEST(EndpointDeadlines, QuarantineOfAKilledSourceEndsOnceItsProcessIsGone) {
  PairConfig cfg;
  cfg.decode_deadlines.drain_timeout_ms = 200;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x12f2;
  open_room(*p, room, 48, {3, 4, 5}, 2);
  p->pcore().faults()->hold_room(room);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1, 2}, 1).ok());
  p->decode().fail(room, ErrorCode::kAborted, "client went away", decode_rank0(), monotonic_ns(), true);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 10s));
  p->decode().release(room);
  ASSERT_EQ(p->decode().quarantined_rooms(), 1u);

  p->decode().on_peer_dead(prefill_rank0(), "presumed dead by the test");  // a false death
  ASSERT_TRUE(p->decode().peer_dead(prefill_rank0()));
  p->pump_for(400ms, [&] { p->pump_decode(); });  // probed at least once: it accepts
  EXPECT_EQ(p->decode().quarantined_rooms(), 1u);
  EXPECT_EQ(p->decode().reclaimed_total(), 0u);

  p->kill_prefill();  // gone: heartbeats stop, its control socket closed
  ASSERT_TRUE(p->pump_until([&] { return p->decode().reclaimed_total() == 1; }, 20s));
  EXPECT_EQ(p->decode().quarantined_rooms(), 0u);
  EXPECT_EQ(p->decode().quarantined_pages(), 0u);
  EXPECT_EQ(p->decode().take_reclaimed(), std::vector<uint64_t>{room});
}

}  // namespace
}  // namespace kvferry
