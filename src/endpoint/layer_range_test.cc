// Layer-wise sends at the endpoint (PrefillEndpoint::send with a LayerRange, kvferry/geometry.h):
// engine-shaped memory (separate KV buffers in an order unlike the layer order), a room sent
// layer by layer lands byte-exact with its aux and state rows; a layer's buffers are written and
// nothing else; page chunks and layer ranges mixed; unequal TP head slices both ways; MLA; the
// refused calls. Every wait is for an event (pump_until a state), never a wall-clock window.
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

// Mismatched bytes of layer `layer`'s buffers (every tensor) of the room's pages at `kv`.
uint64_t verify_layer(const EngineRank& r, uint64_t room, const std::vector<uint64_t>& kv, uint32_t layer) {
  uint64_t bad = 0;
  const uint32_t layers = r.layout.model.num_layers;
  for (size_t i = 0; i < kv.size(); ++i)
    for (uint32_t b = layer; b < r.layout.num_buffers(); b += layers)
      bad += verify_page(r.layout, room, b, i * r.layout.page_size, r.core->kv_page(b, kv[i]));
  return bad;
}

bool layer_is_zero(const EngineRank& r, const std::vector<uint64_t>& kv, uint32_t layer) {
  const uint32_t layers = r.layout.model.num_layers;
  for (uint64_t page : kv)
    for (uint32_t b = layer; b < r.layout.num_buffers(); b += layers) {
      const uint8_t* p = r.core->kv_page(b, page);
      for (uint64_t i = 0; i < r.layout.page_bytes(); ++i)
        if (p[i] != 0) return false;
    }
  return true;
}

// Opens the room on every decode rank at pages `kv`, aux row 6, state row 3.
void open_decode(EnginePair& p, uint64_t room, const std::vector<uint64_t>& kv) {
  const std::vector<uint64_t> st{3};
  for (size_t t = 0; t < p.decode_ranks(); ++t) {
    EngineRank& r = p.d(static_cast<uint32_t>(t));
    r.decode->add_room(room, kv.size() * r.layout.page_size);
    ASSERT_TRUE(r.decode->init(room, kv, 6, st).ok());
  }
}

// Adds the room on every prefill rank (aux row 4, state row 2) with its content in local pages
// 0..pages-1, and waits until each is WaitingForInput.
void open_prefill(EnginePair& p, uint64_t room, uint64_t pages) {
  std::vector<uint64_t> local;
  for (uint64_t i = 0; i < pages; ++i) local.push_back(i);
  for (size_t t = 0; t < p.prefill_ranks(); ++t) {
    EngineRank& r = p.p(static_cast<uint32_t>(t));
    ASSERT_TRUE(r.prefill->add_room(room, pages * r.layout.page_size, 4).ok());
    EnginePair::fill_kv(r, room, 0, local);
    EnginePair::fill_aux(r, room, 4);
    EnginePair::fill_state(r, room, {2});
  }
  for (size_t t = 0; t < p.prefill_ranks(); ++t) {
    EngineRank& r = p.p(static_cast<uint32_t>(t));
    ASSERT_TRUE(p.pump_until([&] { return r.prefill->poll(room) == KVPoll::WaitingForInput; }, 5s)) << t;
  }
}

void expect_room_at_decode(EnginePair& p, uint64_t room, const std::vector<uint64_t>& kv) {
  for (size_t t = 0; t < p.decode_ranks(); ++t) {
    const EngineRank& r = p.d(static_cast<uint32_t>(t));
    ASSERT_TRUE(p.pump_until([&] { return r.decode->poll(room) == KVPoll::Success; }, 10s))
        << "decode " << t << " " << to_string(r.decode->poll(room));
    EXPECT_EQ(EnginePair::verify_kv(r, room, kv), 0u) << "decode " << t;
    EXPECT_EQ(EnginePair::verify_aux(r, room, 6), 0u) << "decode " << t;
    EXPECT_EQ(EnginePair::verify_state(r, room, {3}), 0u) << "decode " << t;
  }
  for (size_t t = 0; t < p.prefill_ranks(); ++t)
    EXPECT_TRUE(p.pump_until([&] { return p.p(static_cast<uint32_t>(t)).prefill->poll(room) == KVPoll::Success; }, 10s));
}

// Every prefill rank sends the room's `pages` pages one layer at a time, then the empty last
// chunk with the state row.
void send_layer_by_layer(EnginePair& p, uint64_t room, uint64_t pages) {
  std::vector<uint64_t> local;
  for (uint64_t i = 0; i < pages; ++i) local.push_back(i);
  const std::vector<uint64_t> state{2};
  for (size_t t = 0; t < p.prefill_ranks(); ++t) {
    EngineRank& r = p.p(static_cast<uint32_t>(t));
    const uint32_t layers = r.layout.model.num_layers;
    for (uint32_t l = 0; l < layers; ++l)
      ASSERT_TRUE(r.prefill->send(room, 0, local, 1000 * (t + 1) + l, {}, false, {l, l + 1}).ok()) << l;
    ASSERT_TRUE(r.prefill->send(room, pages, {}, 1000 * (t + 1) + 999, state, true, {}).ok());
  }
}

TEST(LayerRange, RoomSentLayerByLayerArrivesByteExactAndOnlyItsLayersAreWritten) {
  auto p = make();
  ASSERT_TRUE(p);
  EngineRank& pre = p->p();
  EngineRank& dec = p->d();
  const uint64_t room = 0x71;
  const std::vector<uint64_t> kv{9, 3, 4, 10, 11};
  open_decode(*p, room, kv);
  open_prefill(*p, room, 5);
  const std::vector<uint64_t> local{0, 1, 2, 3, 4};
  // Layers 0 and 2 of 3 first: their chunks complete, layer 1 stays untouched, no Success.
  ASSERT_TRUE(pre.prefill->send(room, 0, local, 1, {}, false, {0, 1}).ok());
  ASSERT_TRUE(pre.prefill->send(room, 0, local, 2, {}, false, {2, 3}).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->chunks_done.size() == 2; }, 5s));
  EXPECT_TRUE(p->chunks_done[0].ok && p->chunks_done[1].ok);
  EXPECT_EQ(verify_layer(dec, room, kv, 0), 0u);
  EXPECT_EQ(verify_layer(dec, room, kv, 2), 0u);
  EXPECT_TRUE(layer_is_zero(dec, kv, 1)) << "a layer range wrote another layer's buffers";
  EXPECT_EQ(pre.prefill->poll(room), KVPoll::Transferring);
  EXPECT_EQ(dec.decode->poll(room), KVPoll::WaitingForInput);
  // Layer 1 as the last call, with the state row: then the final batch and Success.
  const std::vector<uint64_t> state{2};
  ASSERT_TRUE(pre.prefill->send(room, 0, local, 3, state, true, {1, 2}).ok());
  expect_room_at_decode(*p, room, kv);
  // KV (6 buffers x 5 pages) + 2 aux rows + 1 state row + the guard record: each byte once.
  EXPECT_EQ(pre.prefill->room(room)->bytes, 6 * 5 * dec.layout.page_bytes() + 8 + 24 + 40 + sizeof(AuxRecord));
}

TEST(LayerRange, PageChunksAndLayerRangesMixed) {
  auto p = make();
  ASSERT_TRUE(p);
  EngineRank& pre = p->p();
  const uint64_t room = 0x72;
  const std::vector<uint64_t> kv{1, 2, 3, 7, 8, 15};
  open_decode(*p, room, kv);
  open_prefill(*p, room, 6);
  // Chunked prefill, layer-wise: chunk A (pages 0-2) layer by layer, then chunk B (3-5) as
  // layers [0, 2) and layer 2 with the last call.
  for (uint32_t l = 0; l < 3; ++l) ASSERT_TRUE(pre.prefill->send(room, 0, {0, 1, 2}, 10 + l, {}, false, {l, l + 1}).ok());
  ASSERT_TRUE(pre.prefill->send(room, 3, {3, 4, 5}, 20, {}, false, {0, 2}).ok());
  const std::vector<uint64_t> state{2};
  ASSERT_TRUE(pre.prefill->send(room, 3, {3, 4, 5}, 21, state, true, {2, 3}).ok());
  expect_room_at_decode(*p, room, kv);
  EXPECT_EQ(p->chunks_done.size(), 5u);
}

TEST(LayerRange, OnePrefillRankToTwoDecodeRanksLayerByLayer) {
  EnginePairConfig c;
  c.decode_tp = 2;
  auto p = make(c);
  ASSERT_TRUE(p);
  const std::vector<uint64_t> kv{7, 8, 2};
  open_decode(*p, 0x73, kv);
  open_prefill(*p, 0x73, 3);
  send_layer_by_layer(*p, 0x73, 3);
  expect_room_at_decode(*p, 0x73, kv);
}

TEST(LayerRange, TwoPrefillRanksToOneDecodeRankLayerByLayer) {
  EnginePairConfig c;
  c.prefill_tp = 2;
  auto p = make(c);
  ASSERT_TRUE(p);
  const std::vector<uint64_t> kv{1, 5, 6, 12};
  open_decode(*p, 0x74, kv);
  open_prefill(*p, 0x74, 4);
  send_layer_by_layer(*p, 0x74, 4);
  expect_room_at_decode(*p, 0x74, kv);
  // Prefill 1 wrote only its KV heads, each layer once: 6 buffers x 4 pages x its page row.
  EXPECT_EQ(p->p(1).prefill->room(0x74)->bytes, 6 * 4 * p->p(1).layout.page_bytes());
}

TEST(LayerRange, MlaLayerByLayerWithANonSource) {
  EnginePairConfig c;
  c.prefill.model = c.decode.model = testing::toy_mla();
  c.prefill_tp = 2;
  auto p = make(c);
  ASSERT_TRUE(p);
  const std::vector<uint64_t> kv{3, 4};
  open_decode(*p, 0x75, kv);
  open_prefill(*p, 0x75, 2);
  send_layer_by_layer(*p, 0x75, 2);
  expect_room_at_decode(*p, 0x75, kv);
}

TEST(LayerRange, RefusedCallsWriteNothing) {
  auto p = make();
  ASSERT_TRUE(p);
  EngineRank& pre = p->p();
  EngineRank& dec = p->d();
  const uint64_t room = 0x76;
  open_decode(*p, room, {0, 1});
  open_prefill(*p, room, 2);
  auto refused = [&](const Status& s, const std::string& text) {
    return s.code() == ErrorCode::kInvalidArgument && s.message().find(text) != std::string::npos;
  };
  EXPECT_TRUE(refused(pre.prefill->send(room, 0, {0}, 1, {}, false, {2, 4}), "past the model's 3 layers"));
  EXPECT_TRUE(refused(pre.prefill->send(room, 0, {0}, 1, {}, false, {1, 1}), "is empty"));
  ASSERT_TRUE(pre.prefill->send(room, 0, {0, 1}, 2, {}, false, {0, 1}).ok());
  EXPECT_TRUE(refused(pre.prefill->send(room, 0, {0}, 3, {}, false, {0, 2}), "layer 0 has 2 of 2 pages sent"));
  EXPECT_TRUE(refused(pre.prefill->send(room, 0, {0, 1}, 4, {}, true, {1, 2}), "pages of layer 2 unsent"));
  EXPECT_TRUE(refused(pre.prefill->send(room, 2, {}, 5, {}, true, {}), "leaves 2 of the room's 2 pages of layer 1"));
  ASSERT_TRUE(p->pump_until([&] { return p->chunks_done.size() == 1; }, 5s));
  EXPECT_TRUE(layer_is_zero(dec, {0, 1}, 1));
  EXPECT_TRUE(layer_is_zero(dec, {0, 1}, 2));
  EXPECT_EQ(pre.prefill->poll(room), KVPoll::Transferring);
  // The refused calls changed nothing: the rest of the room still completes it.
  ASSERT_TRUE(pre.prefill->send(room, 0, {0, 1}, 6, {}, false, {1, 3}).ok());
  const std::vector<uint64_t> state{2};
  ASSERT_TRUE(pre.prefill->send(room, 2, {}, 7, state, true, {}).ok());
  expect_room_at_decode(*p, room, {0, 1});
}

}  // namespace
}  // namespace kvferry
