// Issue 12 "no state without a deadline, no message without recovery", at the endpoint level
// (endpoint_pair_test_util.h: a prefill and a decode rank in one process, real sockets and UCX):
// the transfer deadline of a room whose writes never complete and what happens to its staging and
// to decode's pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
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

}  // namespace
}  // namespace kvferry
