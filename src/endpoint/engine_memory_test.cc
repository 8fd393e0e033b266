// Engine-shaped memory end to end (kvferry/buffers.h): KV buffers as separate buffers in an order
// unlike the layer order, two aux buffers, one state buffer, kvferry's guard rows; chunked sends
// with an empty last chunk; unequal TP head slices; MLA non-sources concluding on the last chunk.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "endpoint/engine_pair_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::EnginePair;
using testing::EnginePairConfig;
using testing::EngineRank;

std::unique_ptr<EnginePair> make(const EnginePairConfig& cfg = {}) { return testing::make_engine_pair(cfg); }

AuxRecord guard_of(const EngineRank& r, uint64_t row) {
  AuxRecord rec;
  std::memcpy(&rec, r.core->guard_row(row), sizeof rec);
  return rec;
}

bool row_is_zero(const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

TEST(EngineMemory, SeparateBuffersAuxAndStateRowsArriveByteExact) {
  auto p = make();
  ASSERT_TRUE(p);
  EngineRank& pre = p->p();
  EngineRank& dec = p->d();
  ASSERT_EQ(dec.core->shape().kv_offsets.size(), 6u);
  // The KV buffers are not evenly spaced: separate buffers, not a pool.
  EXPECT_NE(dec.core->shape().kv_offsets[1] - dec.core->shape().kv_offsets[0],
            dec.core->shape().kv_offsets[2] - dec.core->shape().kv_offsets[1]);
  const uint64_t room = 0x51;
  const std::vector<uint64_t> kv{9, 3, 4, 10, 11};
  dec.decode->add_room(room, 20);  // 5 pages of 4 tokens
  const std::vector<uint64_t> dstate{2};
  ASSERT_TRUE(dec.decode->init(room, kv, 5, dstate).ok());
  ASSERT_TRUE(pre.prefill->add_room(room, 20, 3).ok());
  ASSERT_TRUE(p->pump_until([&] { return pre.prefill->poll(room) == KVPoll::WaitingForInput; }, 2s));
  EnginePair::fill_kv(pre, room, 0, {0, 1, 2, 5, 6});
  EnginePair::fill_aux(pre, room, 3);
  EnginePair::fill_state(pre, room, {1});
  ASSERT_TRUE(pre.prefill->send(room, 0, {0, 1, 2}, 1, {}, false).ok());
  ASSERT_TRUE(pre.prefill->send(room, 3, {5, 6}, 2, {}, false).ok());
  const std::vector<uint64_t> pstate{1};
  ASSERT_TRUE(pre.prefill->send(room, 5, {}, 3, pstate, true).ok());  // the empty last chunk
  ASSERT_TRUE(p->pump_until([&] { return dec.decode->poll(room) == KVPoll::Success; }, 5s))
      << to_string(dec.decode->poll(room));
  EXPECT_EQ(pre.prefill->poll(room), KVPoll::Success);
  EXPECT_EQ(EnginePair::verify_kv(dec, room, kv), 0u);
  EXPECT_EQ(EnginePair::verify_aux(dec, room, 5), 0u);
  EXPECT_EQ(EnginePair::verify_state(dec, room, dstate), 0u);
  AuxRecord g = guard_of(dec, 5);
  EXPECT_EQ(g.room, room);
  EXPECT_EQ(g.cached_tokens, 20u);
  EXPECT_EQ(g.num_pages, 5u);
  // Nothing else was written: the neighbouring aux, state and guard rows are still zero.
  for (size_t a = 0; a < 2; ++a) {
    EXPECT_TRUE(row_is_zero(dec.core->aux_row(a, 4), dec.core->shape().aux_item_bytes[a]));
    EXPECT_TRUE(row_is_zero(dec.core->aux_row(a, 6), dec.core->shape().aux_item_bytes[a]));
  }
  EXPECT_TRUE(row_is_zero(dec.core->state_row(0, 1), 40));
  EXPECT_TRUE(row_is_zero(dec.core->guard_row(3), kAuxSlotBytes));
  ASSERT_EQ(p->chunks_done.size(), 2u);  // the empty chunk has no ChunkDone
  EXPECT_EQ(p->chunks_done[0].tag, 1u);
  EXPECT_EQ(p->chunks_done[1].tag, 2u);
  EXPECT_TRUE(dec.decode->drained(room, monotonic_ns()));
  EXPECT_TRUE(pre.prefill->drained(room));
  // KV (6 buffers x 5 pages) + 2 aux rows + 1 state row + the guard record.
  EXPECT_EQ(pre.prefill->room(room)->bytes, 6 * 5 * dec.layout.page_bytes() + 8 + 24 + 40 + sizeof(AuxRecord));
}

TEST(EngineMemory, SuccessWaitsForTheLastChunk) {
  auto p = make();
  ASSERT_TRUE(p);
  EngineRank& pre = p->p();
  EngineRank& dec = p->d();
  const uint64_t room = 0x52;
  dec.decode->add_room(room, 8);
  ASSERT_TRUE(dec.decode->init(room, {0, 1}, 0, {}).ok());
  ASSERT_TRUE(pre.prefill->add_room(room, 8, 0).ok());
  ASSERT_TRUE(p->pump_until([&] { return pre.prefill->poll(room) == KVPoll::WaitingForInput; }, 2s));
  EnginePair::fill_kv(pre, room, 0, {0, 1});
  EnginePair::fill_aux(pre, room, 0);
  ASSERT_TRUE(pre.prefill->send(room, 0, {0, 1}, 7, {}, false).ok());  // every page, not last
  ASSERT_TRUE(p->pump_until([&] { return p->chunks_done.size() == 1; }, 5s));
  EXPECT_TRUE(p->chunks_done[0].ok);
  EXPECT_EQ(pre.prefill->poll(room), KVPoll::Transferring);  // no final batch without `last`
  EXPECT_EQ(guard_of(dec, 0).room, 0u);
  EXPECT_EQ(dec.decode->poll(room), KVPoll::WaitingForInput);
  ASSERT_TRUE(pre.prefill->send(room, 2, {}, 8, {}, true).ok());
  ASSERT_TRUE(p->pump_until([&] { return dec.decode->poll(room) == KVPoll::Success; }, 5s));
  EXPECT_EQ(EnginePair::verify_kv(dec, room, {0, 1}), 0u);
  EXPECT_EQ(EnginePair::verify_aux(dec, room, 0), 0u);
}

TEST(EngineMemory, SendRefusesBadChunksAndWritesNothing) {
  auto p = make();
  ASSERT_TRUE(p);
  EngineRank& pre = p->p();
  EngineRank& dec = p->d();
  const uint64_t room = 0x53;
  dec.decode->add_room(room, 8);
  ASSERT_TRUE(dec.decode->init(room, {0, 1}, 1, {}).ok());
  EXPECT_EQ(pre.prefill->add_room(room, 8, 8).code(), ErrorCode::kInvalidArgument);  // 8 aux rows
  EXPECT_FALSE(pre.prefill->has_room(room));
  pre.prefill->add_room(room, 8);  // no aux_index, but the rank has aux buffers
  ASSERT_TRUE(p->pump_until([&] { return pre.prefill->poll(room) == KVPoll::WaitingForInput; }, 2s));
  Status s = pre.prefill->send(room, 0, {0, 1}, 1, {}, true);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no aux_index"), std::string::npos) << s.message();

  const uint64_t r2 = 0x54;
  dec.decode->add_room(r2, 8);
  ASSERT_TRUE(dec.decode->init(r2, {2, 3}, 2, {}).ok());
  ASSERT_TRUE(pre.prefill->add_room(r2, 8, 2).ok());
  ASSERT_TRUE(p->pump_until([&] { return pre.prefill->poll(r2) == KVPoll::WaitingForInput; }, 2s));
  const std::vector<uint64_t> st{0}, bad_st{4};
  auto msg = [&](Status x) { return x.code() == ErrorCode::kInvalidArgument ? x.message() : "accepted"; };
  EXPECT_NE(msg(pre.prefill->send(r2, 0, {0}, 1, st, false)).find("last chunk only"), std::string::npos);
  EXPECT_NE(msg(pre.prefill->send(r2, 0, {0}, 1, {}, true)).find("leaves 1 of the room's 2 pages"), std::string::npos);
  EXPECT_NE(msg(pre.prefill->send(r2, 0, {0, 1}, 1, bad_st, true)).find("state index 4 out of range"),
            std::string::npos);
  EXPECT_NE(msg(pre.prefill->send(r2, 0, {0, 16}, 1, {}, true)).find("local page 16 out of range"),
            std::string::npos);
  EXPECT_NE(msg(pre.prefill->send(r2, 1, {0, 1}, 1, {}, false)).find("past the room's last page"), std::string::npos);
  EXPECT_EQ(pre.prefill->poll(r2), KVPoll::WaitingForInput);
  EXPECT_EQ(pre.core->transport().stats().batches, 0u);
  ASSERT_TRUE(pre.prefill->send(r2, 0, {0, 1}, 1, {}, true).ok());
  EXPECT_NE(msg(pre.prefill->send(r2, 2, {}, 2, {}, true)).find("after the last chunk"), std::string::npos);
  ASSERT_TRUE(p->pump_until([&] { return dec.decode->poll(r2) == KVPoll::Success; }, 5s));
}

TEST(EngineMemory, StateRowCountsThatDifferFailTheRoomOnBothSides) {
  auto p = make();
  ASSERT_TRUE(p);
  EngineRank& pre = p->p();
  EngineRank& dec = p->d();
  const uint64_t room = 0x55;
  dec.decode->add_room(room, 4);
  const std::vector<uint64_t> two{0, 1}, one{3};
  ASSERT_TRUE(dec.decode->init(room, {0}, 1, two).ok());
  ASSERT_TRUE(pre.prefill->add_room(room, 4, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return pre.prefill->poll(room) == KVPoll::WaitingForInput; }, 2s));
  // The last chunk carries pages, so the room's final batch is built with it (prefill_final.cc):
  // the mismatch is found at once, the send writes nothing (an error) and the room fails.
  EXPECT_FALSE(pre.prefill->send(room, 0, {0}, 1, one, true).ok());
  EXPECT_EQ(pre.prefill->poll(room), KVPoll::Failed);
  ASSERT_TRUE(p->pump_until([&] { return dec.decode->poll(room) == KVPoll::Failed; }, 5s));
  auto e = dec.core->registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kProtocolError);
  EXPECT_EQ(e->origin, pre.self);
  EXPECT_NE(e->failure_reason.find("1 state indices here"), std::string::npos) << e->failure_reason;
  EXPECT_EQ(guard_of(dec, 1).room, 0u);  // the final batch never went out
  ASSERT_TRUE(p->pump_until([&] { return dec.decode->drained(room, monotonic_ns()); }, 5s));
}

// Sends a whole room from every prefill rank (pages 0.. locally), with an empty last chunk.
void send_room(EnginePair& p, uint64_t room, uint64_t pages, uint64_t aux, const std::vector<uint64_t>& state) {
  std::vector<uint64_t> local;
  for (uint64_t i = 0; i < pages; ++i) local.push_back(i);
  for (size_t t = 0; t < p.prefill_ranks(); ++t) {
    EngineRank& r = p.p(static_cast<uint32_t>(t));
    ASSERT_TRUE(r.prefill->add_room(room, pages * r.layout.page_size, aux).ok());
  }
  for (size_t t = 0; t < p.prefill_ranks(); ++t) {
    EngineRank& r = p.p(static_cast<uint32_t>(t));
    ASSERT_TRUE(p.pump_until([&] { return r.prefill->poll(room) == KVPoll::WaitingForInput; }, 2s)) << t;
    EnginePair::fill_kv(r, room, 0, local);
    EnginePair::fill_aux(r, room, aux);
    EnginePair::fill_state(r, room, state);
    ASSERT_TRUE(r.prefill->send(room, 0, local, 100 + t, {}, false).ok());
    ASSERT_TRUE(r.prefill->send(room, pages, {}, 200 + t, state, true).ok());
  }
}

// Opens the room on every decode rank at pages kv, aux row 6, state row 3.
void open_decode(EnginePair& p, uint64_t room, const std::vector<uint64_t>& kv) {
  const std::vector<uint64_t> st{3};
  for (size_t t = 0; t < p.decode_ranks(); ++t) {
    EngineRank& r = p.d(static_cast<uint32_t>(t));
    r.decode->add_room(room, kv.size() * r.layout.page_size);
    ASSERT_TRUE(r.decode->init(room, kv, 6, st).ok());
  }
}

void expect_room_at_decode(EnginePair& p, uint64_t room, const std::vector<uint64_t>& kv) {
  for (size_t t = 0; t < p.decode_ranks(); ++t) {
    const EngineRank& r = p.d(static_cast<uint32_t>(t));
    ASSERT_TRUE(p.pump_until([&] { return r.decode->poll(room) == KVPoll::Success; }, 5s))
        << "decode " << t << " " << to_string(r.decode->poll(room));
    EXPECT_EQ(EnginePair::verify_kv(r, room, kv), 0u) << "decode " << t;
    EXPECT_EQ(EnginePair::verify_aux(r, room, 6), 0u) << "decode " << t;
    EXPECT_EQ(EnginePair::verify_state(r, room, {3}), 0u) << "decode " << t;
    EXPECT_EQ(guard_of(r, 6).room, room);
  }
  for (size_t t = 0; t < p.prefill_ranks(); ++t)
    EXPECT_TRUE(p.pump_until([&] { return p.p(static_cast<uint32_t>(t)).prefill->poll(room) == KVPoll::Success; }, 5s));
}

TEST(EngineMemory, OnePrefillRankToTwoDecodeRanksHeadSlices) {
  EnginePairConfig c;
  c.decode_tp = 2;
  auto p = make(c);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->d(0).layout.heads_per_rank, 2u);
  EXPECT_EQ(p->d(1).layout.first_head, 2u);
  const std::vector<uint64_t> kv{7, 8, 2};
  open_decode(*p, 0x61, kv);
  send_room(*p, 0x61, 3, 4, {2});
  expect_room_at_decode(*p, 0x61, kv);
}

TEST(EngineMemory, TwoPrefillRanksToOneDecodeRankAuxFromTheLowestSource) {
  EnginePairConfig c;
  c.prefill_tp = 2;
  auto p = make(c);
  ASSERT_TRUE(p);
  const std::vector<uint64_t> kv{1, 5, 6, 12};
  open_decode(*p, 0x62, kv);
  send_room(*p, 0x62, 4, 2, {0});
  expect_room_at_decode(*p, 0x62, kv);
  // Prefill 1 wrote only its KV heads: 6 buffers x 4 pages x half a page row each.
  EXPECT_EQ(p->p(1).prefill->room(0x62)->bytes, 6 * 4 * p->p(1).layout.page_bytes());
}

TEST(EngineMemory, MlaNonSourceConcludesOnTheLastChunk) {
  EnginePairConfig c;
  c.prefill.model = c.decode.model = testing::toy_mla();
  c.prefill_tp = 2;
  auto p = make(c);
  ASSERT_TRUE(p);
  ASSERT_TRUE(dests_of(p->plan(), 1).empty());
  const std::vector<uint64_t> kv{3, 4};
  open_decode(*p, 0x63, kv);
  send_room(*p, 0x63, 2, 1, {1});
  expect_room_at_decode(*p, 0x63, kv);
  EXPECT_EQ(p->p(1).prefill->room(0x63)->bytes, 0u);
  bool chunk_of_non_source = false;  // its chunk completes without a write
  for (const ChunkDone& d : p->chunks_done) chunk_of_non_source |= d.tag == 101 && d.ok;
  EXPECT_TRUE(chunk_of_non_source);
}

}  // namespace
}  // namespace kvferry
