// A prefill and a decode rank in one process, connected for real (bootstrap service, ZeroMQ
// control plane, UCX shm data plane): a room end to end, failure records, and page reuse: the
// regression tests of docs/ that live at the endpoint level. Each Defect test says how the naive
// design (SGLang/Mooncake-style managers) would fail it. The prefill side's protocol checks and
// failures are in prefill_endpoint_test.cc, the decode side's peers and drains in
// decode_endpoint_test.cc, engine-shaped memory in engine_memory*_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "endpoint/endpoint_pair_steps.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::decode_rank0;
using testing::EndpointPair;
using testing::iota_pages;
using testing::make_pair;
using testing::ms_since;
using testing::open_room;
using testing::PairConfig;
using testing::prefill_rank0;
using testing::transfer_room;

TEST(EndpointPair, FullRoomInTwoChunksArrivesByteExact) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1001;
  const uint64_t tokens = 100;  // 7 pages of 16 tokens, the last one partial
  ASSERT_EQ(p->layout().pages_for(tokens), 7u);
  const std::vector<uint64_t> kv = {9, 10, 11, 3, 4, 15, 0};  // non-contiguous destination

  p->prefill().add_room(room, tokens);
  p->decode().add_room(room, tokens);
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Bootstrapping);
  EXPECT_EQ(p->decode().poll(room), KVPoll::Bootstrapping);
  ASSERT_TRUE(p->decode().init(room, kv, 5).ok());
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::WaitingForInput; }, 2s));

  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1, 2, 3}, 1).ok());
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Transferring);
  ASSERT_TRUE(p->send_chunk(room, 4, {4, 5, 6}, 2).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 5s))
      << to_string(p->decode().poll(room));

  EXPECT_EQ(p->prefill().poll(room), KVPoll::Success);
  EXPECT_EQ(p->verify_decode(room, kv), 0u);
  EXPECT_GT(p->verify_decode(room + 1, kv), 0u);  // the check can tell rooms apart
  AuxRecord aux = p->decode_aux(5);
  EXPECT_EQ(aux.room, room);
  EXPECT_EQ(aux.cached_tokens, tokens);
  EXPECT_EQ(aux.num_pages, 7u);
  ASSERT_EQ(p->chunks_done.size(), 2u);
  EXPECT_EQ(p->chunks_done[0].tag + p->chunks_done[1].tag, 3u);
  EXPECT_TRUE(p->chunks_done[0].ok && p->chunks_done[1].ok);
  const SenderRoom* s = p->prefill().room(room);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->units_done, 7u * p->layout().model.num_layers);  // every page of every layer
  EXPECT_EQ(s->bytes, p->layout().bytes_for_pages(7) + sizeof(AuxRecord));
  EXPECT_FALSE(p->pcore().registry().get(room));
  EXPECT_FALSE(p->dcore().registry().get(room));
  EXPECT_TRUE(p->prefill().drained(room));
  EXPECT_TRUE(p->decode().drained(room, monotonic_ns()));

  p->prefill().release(room);
  p->decode().release(room);
  EXPECT_EQ(p->prefill().live_rooms(), 0u);
  EXPECT_EQ(p->decode().live_rooms(), 0u);
  EXPECT_EQ(p->pcore().registry().open_rooms(), 0u);
  EXPECT_EQ(p->dcore().registry().open_rooms(), 0u);
  EXPECT_EQ(p->prefill().aux_in_use(), 0u);
}

// Naive design: the failure record is popped when read (SGLang's `failure_records.pop(room)`), so
// the second query of a locally failed room finds nothing and reports "unknown reason from another
// rank", and a scheduler that polls twice loses the cause.
TEST(EndpointPair, Defect1_DestructivePop) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1101;
  open_room(*p, room, 32, {4, 5}, 1);
  p->decode().fail(room, ErrorCode::kInjected, "decode rank lost its request", decode_rank0(), monotonic_ns(), true);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 2s));
  p->pump_for(20ms);

  for (int i = 0; i < 3; ++i) {
    auto d = p->dcore().registry().get(room);
    auto f = p->pcore().registry().get(room);
    ASSERT_TRUE(d && f) << "query " << i;
    EXPECT_EQ(d->origin, decode_rank0());
    EXPECT_FALSE(d->is_from_another_rank);  // local at the origin, every time
    EXPECT_EQ(d->code, ErrorCode::kInjected);
    EXPECT_EQ(f->origin, decode_rank0());
    EXPECT_TRUE(f->is_from_another_rank);  // propagated at the peer, every time
    EXPECT_EQ(f->code, ErrorCode::kInjected);
    EXPECT_EQ(f->failure_reason, "decode rank lost its request");
  }
}

// Naive design: a record (or a late status) written after the room was read/released is kept in
// a map keyed by room id, so it leaks, and a later room with the same id is born failed.
TEST(EndpointPair, Defect2_LateRecordDoesNotAttachToReusedRoom) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1201;
  open_room(*p, room, 32, {0, 1}, 1);
  p->decode().fail(room, ErrorCode::kAborted, "client went away", decode_rank0(), monotonic_ns(), true);
  p->decode().release(room);  // decode is done with the room before prefill's answer came
  ASSERT_TRUE(p->pump_until(
      [&] { return p->prefill().poll(room) == KVPoll::Failed && p->prefill().drained(room); }, 2s));
  p->pump_for(50ms);  // prefill's late Failed status reaches decode, which no longer has the room
  EXPECT_FALSE(p->decode().has_room(room));
  EXPECT_FALSE(p->dcore().registry().get(room));
  // A late worker's record for the released room is dropped, not kept.
  EXPECT_FALSE(p->dcore().registry().record(room, ErrorCode::kTransferError, "late worker", prefill_rank0(),
                                            monotonic_ns()));
  EXPECT_EQ(p->dcore().registry().records(), 0u);

  p->prefill().release(room);
  // And a late decode status for the released room reaches prefill.
  RoomStatus late{room, decode_rank0(), KVPoll::Failed, {ErrorCode::kAborted, decode_rank0(), "late", monotonic_ns(), 0}};
  ASSERT_TRUE(p->dcore().send(p->pcore().control().endpoint(), late).ok());
  p->pump_for(50ms);
  EXPECT_FALSE(p->prefill().has_room(room));
  EXPECT_EQ(p->pcore().registry().records(), 0u);

  transfer_room(*p, room, 32, {2, 3}, 2);  // the same id again
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Success);
  EXPECT_FALSE(p->pcore().registry().get(room));
  EXPECT_FALSE(p->dcore().registry().get(room));
}

// Same defect, through the other door: prefill's room succeeded and was released, then decode's
// Failed status for it arrives late (decode's waiting timeout raced prefill's Success). Naive
// design: the status is parked as "for a room that does not exist yet" and the next room with the
// same id is failed with the stale cause.
TEST(EndpointPair, Defect2_LateFailureAfterSuccessDoesNotAttachToReusedRoom) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1202;
  transfer_room(*p, room, 32, {0, 1}, 1);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Success; }, 1s));
  p->prefill().release(room);
  p->decode().release(room);
  RoomStatus late{room, decode_rank0(), KVPoll::Failed,
                  {ErrorCode::kWaitingTimeout, decode_rank0(), "no data within 1 ms", monotonic_ns(), 0}};
  ASSERT_TRUE(p->dcore().send(p->pcore().control().endpoint(), late).ok());
  p->pump_for(50ms);
  EXPECT_FALSE(p->prefill().has_room(room));

  p->prefill().add_room(room, 32);
  EXPECT_NE(p->prefill().poll(room), KVPoll::Failed) << p->pcore().registry().get(room)->str();
  EXPECT_FALSE(p->pcore().registry().get(room));
  p->prefill().release(room);
}

// Naive design: decode frees a failed room's pages at once; a prefill write still in flight lands
// in them afterwards and corrupts the next request's KV.
TEST(EndpointPair, Defect9_NoPageReuseWhileWritesInFlight) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1901;
  open_room(*p, room, 64, {0, 1, 2, 3}, 1);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1, 2, 3}, 1).ok());  // in flight; completion held back
  p->decode().fail(room, ErrorCode::kAborted, "client went away", decode_rank0(), monotonic_ns(), true);
  EXPECT_FALSE(p->decode().drained(room, monotonic_ns()));

  auto hold = [&] {
    p->pump_prefill(/*events=*/false);
    p->pump_decode();
  };
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 2s, hold));
  p->pump_for(100ms, hold);
  EXPECT_FALSE(p->prefill().drained(room));  // its write has not completed as far as it knows
  EXPECT_FALSE(p->decode().drained(room, monotonic_ns()));

  // Prefill is drained once decode's answer with its failure arrived (docs/failure-model.md).
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()) && p->prefill().drained(room); },
                            2s));
  auto d = p->dcore().registry().get(room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kAborted);  // first cause wins over prefill's echo
  EXPECT_FALSE(d->is_from_another_rank);
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->origin, decode_rank0());
  EXPECT_TRUE(f->is_from_another_rank);
}

// The wait for prefill's confirmation is bounded: past the drain deadline decode may stop waiting
// (its driver then quarantines the pages instead of reusing them).
TEST(EndpointPair, Defect9_DrainWaitIsBounded) {
  PairConfig cfg;
  cfg.decode_deadlines.drain_timeout_ms = 200;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x1902;
  open_room(*p, room, 32, {0, 1}, 1);
  p->decode().fail(room, ErrorCode::kAborted, "client went away", decode_rank0(), monotonic_ns(), true);
  const ReceiverRoom* r = p->decode().room(room);
  ASSERT_NE(r, nullptr);
  const int64_t now = monotonic_ns();
  EXPECT_FALSE(p->decode().drained(room, now));
  EXPECT_FALSE(p->decode().drained(room, r->failed_ns + 199'000'000));
  EXPECT_TRUE(p->decode().drained(room, r->failed_ns + 201'000'000));
  EXPECT_EQ(r->terminal.count(prefill_rank0()), 0u);  // drained by deadline, not by confirmation
}

}  // namespace
}  // namespace kvferry
