// A prefill and a decode rank in one process, connected for real (bootstrap service, ZeroMQ
// control plane, UCX shm data plane): a room end to end, protocol checks, and the regression
// tests of DESIGN §4 that live at the endpoint level. Each Defect test says how the naive design
// (SGLang/Mooncake-style managers) would fail it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::decode_rank0;
using testing::EndpointPair;
using testing::PairConfig;
using testing::prefill_rank0;

std::unique_ptr<EndpointPair> make_pair(const PairConfig& cfg = {}) {
  auto p = EndpointPair::create(cfg);
  EXPECT_TRUE(p.ok()) << p.status().str();
  return p.ok() ? std::move(p).value() : nullptr;
}

int64_t ms_since(int64_t t0_ns) { return (monotonic_ns() - t0_ns) / 1'000'000; }

std::vector<uint64_t> iota_pages(uint64_t first, uint64_t n) {
  std::vector<uint64_t> v;
  for (uint64_t i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

// Adds the room on both sides, sends decode's metadata and waits until prefill has it.
void open_room(EndpointPair& p, uint64_t room, uint64_t tokens, const std::vector<uint64_t>& kv, uint32_t slot) {
  p.prefill().add_room(room, tokens);
  p.decode().add_room(room, tokens);
  ASSERT_TRUE(p.decode().init(room, kv, slot).ok());
  ASSERT_TRUE(p.pump_until([&] { return p.prefill().poll(room) == KVPoll::WaitingForInput; }, 2s))
      << "prefill state " << to_string(p.prefill().poll(room));
}

// A whole room from staging pages 0.. to `kv`, until decode reports Success.
void transfer_room(EndpointPair& p, uint64_t room, uint64_t tokens, const std::vector<uint64_t>& kv,
                   uint32_t slot) {
  open_room(p, room, tokens, kv, slot);
  ASSERT_TRUE(p.send_chunk(room, 0, iota_pages(0, kv.size()), room).ok());
  ASSERT_TRUE(p.pump_until([&] { return p.decode().poll(room) == KVPoll::Success; }, 5s))
      << "decode state " << to_string(p.decode().poll(room));
  EXPECT_EQ(p.verify_decode(room, kv), 0u);
}

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
  EXPECT_EQ(s->pages_done, 7u);
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
  RoomStatus late{room, decode_rank0(), KVPoll::Failed, ErrorCode::kAborted, decode_rank0(), monotonic_ns(), "late"};
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
  RoomStatus late{room,           decode_rank0(), KVPoll::Failed, ErrorCode::kWaitingTimeout,
                  decode_rank0(), monotonic_ns(), "no data within 1 ms"};
  ASSERT_TRUE(p->dcore().send(p->pcore().control().endpoint(), late).ok());
  p->pump_for(50ms);
  EXPECT_FALSE(p->prefill().has_room(room));

  p->prefill().add_room(room, 32);
  EXPECT_NE(p->prefill().poll(room), KVPoll::Failed) << p->pcore().registry().get(room)->str();
  EXPECT_FALSE(p->pcore().registry().get(room));
  p->prefill().release(room);
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
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 2s));
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 1u);
  EXPECT_EQ(p->pcore().faults()->stats().failed_batches, 2u);
  EXPECT_TRUE(p->prefill().drained(room));
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

// Naive design: peer death is noticed only by HTTP health probes of the other process (SGLang:
// ~10-16 s), and the dead peer is kept (or blacklisted forever): a restarted rank is never used.
TEST(EndpointPair, Defect8_PeerDeathDetectedFast_Defect7_RestartedPeerIsUsedAgain) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1801, other = 0x1802;
  open_room(*p, room, 64, {0, 1, 2, 3}, 1);
  open_room(*p, other, 32, {4, 5}, 2);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());  // mid-transfer
  ASSERT_TRUE(p->pump_until([&] { return p->chunks_done.size() == 1; }, 2s));
  ASSERT_EQ(p->prefill().poll(room), KVPoll::Transferring);

  const uint64_t lines0 = lines_above_debug();
  p->kill_decode();
  const int64_t t0 = monotonic_ns();
  ASSERT_TRUE(p->pump_until(
      [&] { return p->prefill().poll(room) == KVPoll::Failed && p->prefill().poll(other) == KVPoll::Failed; }, 3s));
  const int64_t detect_ms = ms_since(t0);
  RecordProperty("detect_ms", static_cast<int>(detect_ms));
  EXPECT_LT(detect_ms, 1500) << "peer death took " << detect_ms << " ms";
  for (uint64_t r : {room, other}) {
    auto e = p->pcore().registry().get(r);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
    EXPECT_EQ(e->origin, decode_rank0());
    EXPECT_TRUE(e->is_from_another_rank);
    EXPECT_TRUE(p->prefill().drained(r));
  }
  EXPECT_EQ(lines_above_debug() - lines0, 1u);  // one line per dead peer, not one per room
  EXPECT_EQ(p->prefill().peers(), 0u);          // the dead peer is forgotten
  // Still listened to (a peer that answers again is reconnected), but not reported dead twice.
  EXPECT_EQ(p->pcore().monitor().watched(), 1u);
  EXPECT_TRUE(p->pcore().monitor().take_dead(monotonic_ns() + 10'000'000'000).empty());
  p->prefill().release(room);
  p->prefill().release(other);

  // A new decode process registers again and is used for a new room.
  ASSERT_TRUE(p->start_decode().ok());
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().peers() == 1; }, 2s));
  transfer_room(*p, 0x1803, 64, {7, 8, 9, 10}, 3);
  EXPECT_EQ(p->prefill().poll(0x1803), KVPoll::Success);
  EXPECT_EQ(lines_above_debug() - lines0, 1u);
}

// The decode side's view: its prefill peer dies, the rooms it feeds fail at once with the peer
// as origin, and a restarted prefill rank found again at the bootstrap service is used again.
TEST(EndpointPair, Defect8_PrefillDeathDetectedFast_Defect7_RestartedPrefillIsFoundAgain) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1811;
  open_room(*p, room, 32, {0, 1}, 1);
  p->kill_prefill();
  const int64_t t0 = monotonic_ns();
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 3s));
  const int64_t detect_ms = ms_since(t0);
  RecordProperty("detect_ms", static_cast<int>(detect_ms));
  EXPECT_LT(detect_ms, 1500) << "peer death took " << detect_ms << " ms";
  auto e = p->dcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(e->origin, prefill_rank0());
  EXPECT_TRUE(e->is_from_another_rank);
  EXPECT_TRUE(p->decode().drained(room, monotonic_ns()));  // a dead process writes nothing more
  p->decode().release(room);

  ASSERT_TRUE(p->start_prefill().ok());  // re-registers at the bootstrap service, new endpoint
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().peers() == 1; }, 3s))
      << "the decode rank never registered its pool with the restarted prefill rank";
  transfer_room(*p, 0x1812, 32, {2, 3}, 2);
  EXPECT_EQ(p->decode().poll(0x1812), KVPoll::Success);
}

// Issue 3 ("No rank waits forever"): a killed prefill rank restarts and its engine takes rooms
// again before this decode rank has found it at the bootstrap service (a lookup every 100 ms).
// Before the fix such a room failed here at once ("prefill/tp0 is down", a wrong attribution)
// and the restarted prefill rank was never told: it waited for metadata until its 300 s
// bootstrap timeout, and the router for its request timeout. Now the room waits for the source
// to register again and then goes through.
void kill_prefill_until_detected(EndpointPair& p) {
  const uint64_t seen = 0x1830;  // a room in flight, so the death is observed through it
  open_room(p, seen, 32, {0, 1}, 1);
  p.kill_prefill();
  ASSERT_TRUE(p.pump_until([&] { return p.decode().poll(seen) == KVPoll::Failed; }, 3s));
  ASSERT_TRUE(p.decode().drained(seen, monotonic_ns()));
  p.decode().release(seen);
}

TEST(EndpointPair, Issue3_RoomForRestartedPrefillNotYetFoundAgainSucceeds) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  kill_prefill_until_detected(*p);
  ASSERT_TRUE(p->start_prefill().ok());  // back at the bootstrap service, not yet found again
  const uint64_t room = 0x1831;
  p->prefill().add_room(room, 32);
  p->decode().add_room(room, 32);  // no pump in between: decode still has the peer down
  ASSERT_TRUE(p->decode().init(room, {2, 3}, 2).ok());
  EXPECT_EQ(p->decode().poll(room), KVPoll::Bootstrapping) << "failed at once: "
      << (p->dcore().registry().get(room) ? p->dcore().registry().get(room)->str() : "");
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) != KVPoll::Bootstrapping; }, 3s))
      << "the restarted prefill rank never got the room's metadata";
  ASSERT_EQ(p->prefill().poll(room), KVPoll::WaitingForInput);
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 3s));
  EXPECT_EQ(p->verify_decode(room, {2, 3}), 0u);
  EXPECT_FALSE(p->dcore().registry().get(room));
}

// The same window, but the room fails here (an abort, a local fault) before the source is found
// again: the restarted prefill rank is told when it is found, so it does not wait for metadata.
TEST(EndpointPair, Issue3_FailureWhileSourceDownIsToldWhenItIsBack) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  kill_prefill_until_detected(*p);
  ASSERT_TRUE(p->start_prefill().ok());
  const uint64_t room = 0x1832;
  p->prefill().add_room(room, 32);
  p->decode().add_room(room, 32);
  p->decode().fail(room, ErrorCode::kAborted, "aborted by the router", decode_rank0(), monotonic_ns(), true);
  ASSERT_TRUE(p->decode().drained(room, monotonic_ns()));  // no metadata went out
  p->decode().release(room);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 3s))
      << "the restarted prefill rank still waits for metadata";
  auto e = p->pcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kAborted);
  EXPECT_EQ(e->origin, decode_rank0());
  EXPECT_TRUE(e->is_from_another_rank);
}

// A source that stays down: a room waiting for it fails within the lookup timeout after the death,
// with the source as origin; once that passed, a new room for it fails at once.
TEST(EndpointPair, Issue3_RoomWaitingForDeadSourceFailsAtLookupTimeout) {
  PairConfig cfg;
  cfg.decode_deadlines.lookup_timeout_ms = 1500;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  kill_prefill_until_detected(*p);
  const int64_t t_detected = monotonic_ns();
  const uint64_t room = 0x1833;
  p->decode().add_room(room, 32);
  ASSERT_TRUE(p->decode().init(room, {2, 3}, 2).ok());
  EXPECT_EQ(p->decode().poll(room), KVPoll::Bootstrapping);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 4s));
  const int64_t failed_after_ms = ms_since(t_detected);
  EXPECT_GE(failed_after_ms, 1400);  // not before the deadline: the source could have come back
  EXPECT_LT(failed_after_ms, 2500);
  auto e = p->dcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(e->origin, prefill_rank0());
  EXPECT_NE(e->failure_reason.find("did not register again within 1500 ms"), std::string::npos) << e->failure_reason;
  EXPECT_TRUE(p->decode().drained(room, monotonic_ns()));
  p->decode().release(room);

  const uint64_t late = 0x1834;
  p->decode().add_room(late, 32);
  EXPECT_EQ(p->decode().poll(late), KVPoll::Failed);
  EXPECT_TRUE(p->decode().drained(late, monotonic_ns()));
}

// Naive design: a single transport error marks the peer dead until it re-registers, but a live
// peer never re-registers, so every later room bound for it fails (Mooncake's blacklist) or waits
// for its timeout.
TEST(EndpointPair, Defect7_TransientErrorDoesNotBlacklistPeer) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1701;
  open_room(*p, room, 32, {0, 1}, 1);
  p->pcore().faults()->fail_next_writes(1, ErrorCode::kPeerUnreachable);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until(
      [&] { return p->prefill().poll(room) == KVPoll::Failed && p->decode().poll(room) == KVPoll::Failed; }, 2s));
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 2s));
  p->prefill().release(room);
  p->decode().release(room);

  p->pump_for(300ms);  // the decode rank is alive: heartbeats keep arriving
  const uint64_t next = 0x1702;
  p->prefill().add_room(next, 32);
  p->decode().add_room(next, 32);
  ASSERT_TRUE(p->decode().init(next, {2, 3}, 2).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(next) != KVPoll::Bootstrapping; }, 2s));
  ASSERT_EQ(p->prefill().poll(next), KVPoll::WaitingForInput)
      << "live decode peer blacklisted: " << p->pcore().registry().get(next)->str();
  ASSERT_TRUE(p->send_chunk(next, 0, {0, 1}, 2).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(next) == KVPoll::Success; }, 3s));
}

// Naive design: liveness is judged by the main loop's own traffic or by probes answered by the
// main loop, so a peer busy for longer than the timeout (a long forward pass) is declared dead.
TEST(EndpointPair, Defect8_BusyPeerNotDeclaredDead) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1821;
  open_room(*p, room, 32, {0, 1}, 1);
  const uint64_t lines0 = lines_above_debug();

  p->pump_for(2s, [&] { p->pump_prefill(); });  // decode busy for 2 s (> 3x the timeout)
  EXPECT_EQ(p->prefill().poll(room), KVPoll::WaitingForInput);
  EXPECT_EQ(p->prefill().peers(), 1u);
  p->pump_decode();
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);
  EXPECT_FALSE(p->dcore().registry().get(room));

  p->pump_for(2s, [&] { p->pump_decode(); });  // and now prefill busy for 2 s
  p->pump_prefill();
  EXPECT_EQ(p->prefill().poll(room), KVPoll::WaitingForInput);
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);
  EXPECT_EQ(p->prefill().peers(), 1u);
  EXPECT_EQ(p->decode().peers(), 1u);

  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 3s));
  EXPECT_EQ(p->verify_decode(room, {0, 1}), 0u);
  EXPECT_EQ(lines_above_debug(), lines0);
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

  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 2s));
  EXPECT_TRUE(p->prefill().drained(room));
  auto d = p->dcore().registry().get(room);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, ErrorCode::kAborted);  // first cause wins over prefill's echo
  EXPECT_FALSE(d->is_from_another_rank);
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->origin, decode_rank0());
  EXPECT_TRUE(f->is_from_another_rank);
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

  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 2s));
  EXPECT_TRUE(p->prefill().drained(room));
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 1u);  // by confirmation
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, ErrorCode::kTransferError);  // decode did not echo a second cause back
  EXPECT_FALSE(f->is_from_another_rank);
  EXPECT_EQ(lines_above_debug(), lines0);  // endpoints log failures at debug; the driver reports
}

// A failure with nothing in flight goes out once, terminal: no early notice precedes it.
TEST(EndpointPair, PrefillFailureWithNothingInFlightIsTerminalAtOnce) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1904;
  open_room(*p, room, 32, {0, 1}, 1);
  p->prefill().fail(room, ErrorCode::kTransferError, "copy engine fault", prefill_rank0(), monotonic_ns(), true);
  EXPECT_TRUE(p->prefill().drained(room));
  EXPECT_FALSE(p->prefill().room(room)->early_failure_sent);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 2s));
  EXPECT_EQ(p->decode().poll(room), KVPoll::Failed);
  EXPECT_EQ(p->decode().room(room)->terminal.count(prefill_rank0()), 1u);
  EXPECT_EQ(p->decode().room(room)->failure_heard.count(prefill_rank0()), 0u);
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
  RoomStatus late{again, decode_rank0(), KVPoll::Failed, ErrorCode::kWaitingTimeout, decode_rank0(),
                  monotonic_ns(), "late"};
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
}  // namespace kvferry
