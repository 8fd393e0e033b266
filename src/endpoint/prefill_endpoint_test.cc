// The prefill side of an endpoint pair (endpoint_pair_test_util.h): protocol checks on what decode
// sends, failures and their causes, late frames and tombstones, early failure notices.
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(EndpointPair, OutOfRangePageIndexIsAProtocolErrorAndWritesNothing) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1002;
  const uint64_t bad_page = p->layout().num_pages + 5;
  p->prefill().add_room(room, 48);  // 3 pages
  p->decode().add_room(room, 48);
  EXPECT_EQ(p->decode().init(room, {1, 2, bad_page}, 0).code(), ErrorCode::kInvalidArgument);  // decode checks
  // A decode rank that does not check (or lies): the metadata reaches prefill as it is.
  p->prefill().on_message(Message(RoomMetadata{room, decode_rank0(), {1, 2, bad_page}, 0, {}, 1}));
  const uint8_t* base = p->dcore().base();
  std::vector<uint8_t> before(base, base + p->layout().total_bytes());

  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 2s));
  auto e = p->pcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kProtocolError);
  EXPECT_EQ(e->origin, prefill_rank0());
  EXPECT_FALSE(e->is_from_another_rank);
  EXPECT_NE(e->failure_reason.find("out of range"), std::string::npos) << e->failure_reason;
  p->fill_staging(room, 0, {0, 1, 2});
  EXPECT_FALSE(p->prefill().send(room, 0, {0, 1, 2}, 1).ok());  // a Failed room sends nothing

  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 2s));
  auto d = p->dcore().registry().get(room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kProtocolError);
  EXPECT_EQ(d->origin, prefill_rank0());
  EXPECT_TRUE(d->is_from_another_rank);
  EXPECT_EQ(p->pcore().transport().stats().batches, 0u);
  EXPECT_EQ(p->pcore().transport().stats().bytes_written, 0u);
  EXPECT_EQ(std::memcmp(before.data(), base, before.size()), 0);
  EXPECT_TRUE(p->decode().drained(room, monotonic_ns()));  // prefill's terminal status arrived
}

// Naive design: the status message carries no reason (Mooncake's bare "failed" byte), so decode
// says "unknown reason" or waits for its own 300 s timeout.
TEST(EndpointPair, Defect4_FailureCarriesReason) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1401;
  const std::string reason = "injected: link flap on port 1";
  open_room(*p, room, 64, {8, 9, 10, 11}, 3);
  p->pcore().faults()->fail_room(room, ErrorCode::kTransferError, reason);
  const int64_t t0 = monotonic_ns();
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->send_chunk(room, 2, {2, 3}, 2).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 1s))
      << "decode still " << to_string(p->decode().poll(room));
  EXPECT_LT(ms_since(t0), 1000);

  auto d = p->dcore().registry().get(room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kTransferError);
  EXPECT_EQ(d->origin, prefill_rank0());
  EXPECT_EQ(d->failure_reason, reason);
  EXPECT_EQ(d->failure_reason.find("unknown"), std::string::npos);
  EXPECT_TRUE(d->is_from_another_rank);
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, ErrorCode::kTransferError);
  EXPECT_FALSE(f->is_from_another_rank);
  // Decode may have failed on prefill's early notice, with the second batch still in flight: the
  // terminal status (well within the 10 s drain deadline) drains both sides.
  // Prefill is drained once decode's answer with its failure arrived (docs/failure-model.md).
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()) && p->prefill().drained(room); },
                            2s));
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 1u);
  EXPECT_EQ(p->pcore().faults()->stats().failed_batches, 2u);
  ASSERT_EQ(p->chunks_done.size(), 2u);
  EXPECT_FALSE(p->chunks_done[0].ok || p->chunks_done[1].ok);
}

// Naive design: prefill creates room state whenever metadata arrives (SGLang's transfer_infos),
// so metadata that comes after prefill gave up and released the room brings it back, and that
// resurrected room waits forever (or leaks); decode never hears why.
TEST(EndpointPair, Defect5_LateMetadataDoesNotResurrect) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1501;
  p->prefill().add_room(room, 32);
  p->prefill().set_bootstrap_deadline(room, monotonic_ns() - 1);
  p->prefill().tick(monotonic_ns());
  ASSERT_EQ(p->prefill().poll(room), KVPoll::Failed);
  EXPECT_EQ(p->pcore().registry().get(room)->code, ErrorCode::kBootstrapTimeout);
  ASSERT_TRUE(p->prefill().drained(room));
  p->prefill().release(room);

  p->decode().add_room(room, 32);  // decode got the request late
  ASSERT_TRUE(p->decode().init(room, {6, 7}, 4).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 2s));
  EXPECT_FALSE(p->prefill().has_room(room));
  EXPECT_EQ(p->prefill().live_rooms(), 0u);
  EXPECT_EQ(p->pcore().registry().open_rooms(), 0u);
  auto d = p->dcore().registry().get(room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kBootstrapTimeout);  // the original cause, not "unknown"
  EXPECT_EQ(d->origin, prefill_rank0());
  EXPECT_TRUE(d->is_from_another_rank);
  EXPECT_TRUE(p->decode().drained(room, monotonic_ns()));
}

// A prefill rank fails the room as it creates it (replay fault prefill_fail), before decode knew
// the room: the failure status it sent then found no room on decode. The room is not released
// yet (the engine waits for agreement), so the metadata decode sends later reaches a Failed
// room; it must be answered with the cause, or decode waits until its waiting deadline.
TEST(EndpointPair, MetadataForARoomThatFailedBeforeItIsAnsweredWithTheCause) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1502;
  p->prefill().add_room(room, 32);
  p->prefill().fail(room, ErrorCode::kInjected, "injected prefill failure", prefill_rank0(),
                    monotonic_ns(), true);
  ASSERT_EQ(p->prefill().poll(room), KVPoll::Failed);
  p->pump_until([] { return false; }, std::chrono::milliseconds(50));  // the early status lands

  p->decode().add_room(room, 32);  // decode gets the request after prefill failed it
  ASSERT_TRUE(p->decode().init(room, {6, 7}, 4).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 2s))
      << "decode still " << to_string(p->decode().poll(room));
  EXPECT_TRUE(p->prefill().has_room(room));  // answered while the room still exists
  auto d = p->dcore().registry().get(room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kInjected);
  EXPECT_EQ(d->origin, prefill_rank0());
  EXPECT_EQ(d->failure_reason, "injected prefill failure");
  EXPECT_TRUE(d->is_from_another_rank);
}

// Naive design: a sender waits for metadata forever and a receiver waits for data forever (no
// deadline on those states), so one lost message pins memory until restart.
TEST(EndpointPair, Defect5_RoomsNeverStuck) {
  PairConfig cfg;
  cfg.prefill_deadlines.bootstrap_timeout_ms = 150;  // the configured deadline is the default one
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);

  // Bootstrap timeout from the configured deadline: metadata never comes.
  const uint64_t a = 0x1511;
  int64_t t0 = monotonic_ns();
  p->prefill().add_room(a, 32);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(a) == KVPoll::Failed; }, 2s));
  EXPECT_GE(ms_since(t0), 150);
  auto ea = p->pcore().registry().get(a);
  ASSERT_TRUE(ea);
  EXPECT_EQ(ea->code, ErrorCode::kBootstrapTimeout);
  EXPECT_EQ(ea->origin, prefill_rank0());
  EXPECT_NE(ea->failure_reason.find("decode/tp0"), std::string::npos) << ea->failure_reason;

  // Bootstrap timeout from a per-room deadline.
  const uint64_t b = 0x1512;
  p->prefill().add_room(b, 32);
  p->prefill().set_bootstrap_deadline(b, monotonic_ns() + 30'000'000);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(b) == KVPoll::Failed; }, 2s));
  EXPECT_EQ(p->pcore().registry().get(b)->code, ErrorCode::kBootstrapTimeout);

  // Waiting timeout: the metadata went out, the data never comes; prefill is told why.
  const uint64_t c = 0x1513;
  open_room(*p, c, 32, {0, 1}, 2);
  t0 = monotonic_ns();
  p->decode().set_waiting_deadline(c, t0 + 100'000'000);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(c) == KVPoll::Failed; }, 2s));
  EXPECT_GE(ms_since(t0), 100);
  auto ec = p->dcore().registry().get(c);
  ASSERT_TRUE(ec);
  EXPECT_EQ(ec->code, ErrorCode::kWaitingTimeout);
  EXPECT_EQ(ec->origin, decode_rank0());
  EXPECT_FALSE(ec->is_from_another_rank);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(c) == KVPoll::Failed; }, 2s));
  auto pc = p->pcore().registry().get(c);
  ASSERT_TRUE(pc);
  EXPECT_EQ(pc->code, ErrorCode::kWaitingTimeout);
  EXPECT_EQ(pc->origin, decode_rank0());
  EXPECT_TRUE(pc->is_from_another_rank);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(c, monotonic_ns()); }, 2s));
}

// Issue 5: a room that fails on the prefill rank while its writes are in flight is failed on decode
// at once (an early, non-terminal Failed), not once the transport drained them; decode still keeps
// its pages until the terminal Failed says no write of the source can land any more.
TEST(EndpointPair, PrefillFailureReachesDecodeBeforeWritesDrainPagesKeptUntilTerminal) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1903;
  open_room(*p, room, 64, {4, 5, 6, 7}, 2);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1, 2, 3}, 1).ok());  // in flight; completion held back
  const uint64_t lines0 = lines_above_debug();
  p->prefill().fail(room, ErrorCode::kTransferError, "copy engine fault", prefill_rank0(), monotonic_ns(), true);
  ASSERT_EQ(p->prefill().poll(room), KVPoll::Failed);
  EXPECT_FALSE(p->prefill().drained(room));

  auto hold = [&] {
    p->pump_prefill(/*events=*/false);
    p->pump_decode();
  };
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 2s, hold));
  EXPECT_EQ(p->prefill().room(room)->inflight, 1u);  // decode failed before the writes completed
  const ReceiverRoom* r = p->decode().room(room);
  ASSERT_NE(r, nullptr);
  EXPECT_NE(r->failed_ns, 0);
  EXPECT_EQ(r->terminal.count(prefill_rank0()), 0u);
  EXPECT_EQ(r->failure_heard.count(prefill_rank0()), 1u);
  auto d = p->dcore().registry().get(room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kTransferError);
  EXPECT_EQ(d->origin, prefill_rank0());
  EXPECT_EQ(d->failure_reason, "copy engine fault");
  EXPECT_TRUE(d->is_from_another_rank);

  p->pump_for(100ms, hold);  // the writes stay in flight: decode must not release the pages
  EXPECT_FALSE(p->decode().drained(room, monotonic_ns()));
  EXPECT_FALSE(p->prefill().drained(room));
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 0u);

  // Prefill is drained once decode's answer with its failure arrived (docs/failure-model.md).
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()) && p->prefill().drained(room); },
                            2s));
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 1u);  // by confirmation
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, ErrorCode::kTransferError);  // decode did not echo a second cause back
  EXPECT_FALSE(f->is_from_another_rank);
  EXPECT_EQ(lines_above_debug(), lines0);  // endpoints log failures at debug; the driver reports
}

// The last chunk's writes carry the room's final batch (aux, state and guard rows) to each
// destination, so a room costs one write round, not two (prefill_final.cc): the batch is out as
// soon as the last send() returns, beside the earlier chunk still in flight, and no further batch
// follows the KV writes' completion.
TEST(EndpointPair, TheLastChunkCarriesTheFinalBatch) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1A01;
  const std::vector<uint64_t> kv{4, 5, 6, 7};
  open_room(*p, room, 64, kv, 2);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  EXPECT_FALSE(p->prefill().room(room)->aux_submitted);
  ASSERT_TRUE(p->send_chunk(room, 2, {2, 3}, 2).ok());  // the last chunk
  EXPECT_TRUE(p->prefill().room(room)->aux_submitted);
  EXPECT_TRUE(p->prefill().room(room)->final_in_chunk);
  EXPECT_EQ(p->prefill().room(room)->inflight, 2u);  // the two chunks' batches, nothing else
  uint32_t most_inflight = 0;
  auto watch = [&] {
    p->pump();
    if (const SenderRoom* r = p->prefill().room(room)) most_inflight = std::max(most_inflight, r->inflight);
  };
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 5s, watch));
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Success);
  EXPECT_LE(most_inflight, 2u);
  EXPECT_EQ(p->verify_decode(room, kv), 0u);
}

// A last send of zero pages has no writes to ride with: the final batch goes out on its own once
// every KV write completed, and the room succeeds as before.
TEST(EndpointPair, AnEmptyLastChunkSendsTheFinalBatchAfterTheWrites) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1A02;
  const std::vector<uint64_t> kv{4, 5, 6, 7};
  open_room(*p, room, 64, kv, 2);
  const std::vector<uint64_t> all{0, 1, 2, 3};
  p->fill_staging(room, 0, all);
  ASSERT_TRUE(p->prefill().send(room, 0, all, 1, {}, false).ok());
  ASSERT_TRUE(p->prefill().send(room, 4, {}, 2, {}, true).ok());
  EXPECT_FALSE(p->prefill().room(room)->final_in_chunk);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 5s));
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Success);
  EXPECT_EQ(p->verify_decode(room, kv), 0u);
}

// Rooms without an aux_index stage their guard record in one of the prefill rank's few staging
// rows (at most its aux rows). A row is free again once the room's final batch completed, not
// only when the engine releases the room: six rooms through four rows, none released, all succeed.
// Before, the fifth sat in Transferring with every byte landed until decode's waiting deadline.
TEST(EndpointPair, StagingGuardRowsComeBackWhenTheFinalBatchCompleted) {
  PairConfig cfg;
  cfg.layout.aux_slots = 4;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  for (uint64_t i = 0; i < 6; ++i) {
    const uint64_t room = 0x1C00 + i;
    SCOPED_TRACE(room);
    transfer_room(*p, room, 16, {i}, static_cast<uint32_t>(i % 4));
    EXPECT_EQ(p->prefill().poll(room), KVPoll::Success);
    EXPECT_FALSE(p->prefill().room(room)->aux_staging.has_value());
  }
}

// A failure with nothing in flight goes out once, terminal: no early notice precedes it.
TEST(EndpointPair, PrefillFailureWithNothingInFlightIsTerminalAtOnce) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1904;
  open_room(*p, room, 32, {0, 1}, 1);
  p->prefill().fail(room, ErrorCode::kTransferError, "copy engine fault", prefill_rank0(), monotonic_ns(), true);
  EXPECT_TRUE(p->prefill().room(room)->terminal_sent);
  EXPECT_FALSE(p->prefill().room(room)->early_failure_sent);
  // Drained once the destination answered with its failure (docs/failure-model.md).
  EXPECT_FALSE(p->prefill().drained(room));
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()) && p->prefill().drained(room); }, 2s));
  EXPECT_EQ(p->prefill().room(room)->failure_heard.count(decode_rank0()), 1u);
  EXPECT_EQ(p->decode().poll(room), KVPoll::Failed);
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 1u);
  EXPECT_EQ(p->decode().room(room)->failure_heard.count(prefill_rank0()), 0u);
}

// Tombstones are capped (memory does not grow with rooms served), succeeded rooms' churn does not
// push out a failed room's cause, and a room released, added and released again keeps its newer
// tombstone when the older FIFO entry is popped.
TEST(EndpointPair, TombstonesCappedAndKeepGuarantees) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t failed_room = 0x1601;
  p->prefill().add_room(failed_room, 32);
  p->prefill().set_bootstrap_deadline(failed_room, monotonic_ns() - 1);
  p->prefill().tick(monotonic_ns());
  ASSERT_EQ(p->prefill().poll(failed_room), KVPoll::Failed);
  p->prefill().release(failed_room);

  const uint64_t again = 0x1602;  // released, added again, released again
  p->prefill().add_room(again, 32);
  p->prefill().release(again);
  p->prefill().add_room(again, 32);
  p->prefill().release(again);

  // Push the first `again` entry out of the FIFO, but not the second.
  const size_t cap = PrefillEndpoint::kMaxOkTombstones;
  for (uint64_t i = 0; i < cap - 1; ++i) {
    p->prefill().add_room(0x100000 + i, 32);
    p->prefill().release(0x100000 + i);
  }
  EXPECT_EQ(p->prefill().tombstones(), cap + 1);  // `cap` succeeded + the failed one
  RoomStatus late{again, decode_rank0(), KVPoll::Failed,
                  {ErrorCode::kWaitingTimeout, decode_rank0(), "late", monotonic_ns(), 0}};
  ASSERT_TRUE(p->dcore().send(p->pcore().control().endpoint(), late).ok());
  p->pump_for(50ms);
  p->prefill().add_room(again, 32);
  EXPECT_NE(p->prefill().poll(again), KVPoll::Failed);  // the late status was for the old room
  EXPECT_FALSE(p->pcore().registry().get(again));
  p->prefill().release(again);

  // Many more succeeded rooms: the count stays at the cap.
  for (uint64_t i = 0; i < 3 * cap; ++i) {
    p->prefill().add_room(0x200000 + i, 32);
    p->prefill().release(0x200000 + i);
  }
  EXPECT_EQ(p->prefill().tombstones(), cap + 1);

  // The failed room's cause survived the churn: late metadata is answered with it.
  p->decode().add_room(failed_room, 32);
  ASSERT_TRUE(p->decode().init(failed_room, {6, 7}, 4).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(failed_room) == KVPoll::Failed; }, 2s));
  EXPECT_FALSE(p->prefill().has_room(failed_room));
  auto d = p->dcore().registry().get(failed_room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kBootstrapTimeout);
  EXPECT_EQ(d->origin, prefill_rank0());
}

}  // namespace
// Only a room's own destinations speak for it: a Failed status or metadata naming a decode rank
// this rank does not write the room to (another tp_rank, another DP group, a prefill rank) is
// refused and counted; the room goes on, and its destination's status still fails it. (Since
// issue 31 these identities are outside the transfer plan altogether: refused before the room is
// looked at, counted as outside_plan.)
TEST(EndpointPair, StatusesAndMetadataFromNonDestinationsAreRefused) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1701;
  p->prefill().add_room(room, 32);
  const Failure forged{ErrorCode::kAborted, decode_rank0(), "forged", monotonic_ns(), 0};
  const RankId liars[] = {{Role::kDecode, 0, 5, 0}, {Role::kDecode, 0, 0, 3}, {Role::kPrefill, 0, 1, 0},
                          {Role::kDecode, 7, 0, 0}};
  for (const RankId& liar : liars) {
    p->prefill().on_message(Message(RoomStatus{room, liar, KVPoll::Failed, forged, true}));
    p->prefill().on_message(Message(RoomMetadata{room, liar, {1, 2}, 0, {}, 1}));
  }
  EXPECT_EQ(p->prefill().foreign_messages() + p->pcore().refusals().count(Refusal::kOutsidePlan),
            2 * std::size(liars));
  EXPECT_NE(p->prefill().poll(room), KVPoll::Failed);
  EXPECT_FALSE(p->pcore().registry().get(room));
  EXPECT_FALSE(p->prefill().metadata_complete(room));

  p->prefill().on_message(Message(RoomStatus{room, decode_rank0(), KVPoll::Failed, forged, true}));
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Failed);
  auto e = p->pcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kAborted);
  EXPECT_EQ(e->origin, decode_rank0());
  EXPECT_EQ(p->prefill().foreign_messages() + p->pcore().refusals().count(Refusal::kOutsidePlan),
            2 * std::size(liars));
}

}  // namespace kvferry
