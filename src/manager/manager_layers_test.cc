// Layer-wise sends through the public Sender (kvferry/manager.h send(pages, LayerRange, ...)):
// prefill and decode managers in one process over shm and tcp, caller-pumped: a room sent layer
// by layer (and in page chunks) lands byte-exact; prefill TP 2 -> decode TP 1 (head slices)
// layer by layer; the refused calls name the value; a failure in the middle of a layer-wise room
// fails it cleanly on both sides. Every wait is for an event with a deadline, never a window.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/bootstrap.h"
#include "kvferry/content.h"
#include "kvferry/fault_transport.h"
#include "kvferry/manager.h"
#include "manager/manager_pair_test_util.h"
#include "manager/manager_tp_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

using Ranks = testing::TpRanks;

ManagerConfig config(const RankId& self, uint32_t tp, uint32_t peer_tp, const std::string& transport,
                     const std::string& bootstrap) {
  ManagerConfig c = testing::base_config(self.role, transport, false);  // Qwen2.5-7B: 28 layers, 4 KV heads
  c.self = self;
  c.tp_size = tp;
  c.peer_tp_size = peer_tp;
  c.bootstrap_address = bootstrap;
  return c;
}

std::unique_ptr<Ranks> make_ranks(const std::string& transport, uint32_t prefill_tp = 1) {
  return testing::make_tp_ranks(prefill_tp, [&](const RankId& self, uint32_t tp, uint32_t peer_tp,
                                                const std::string& bootstrap) {
    return config(self, tp, peer_tp, transport, bootstrap);
  });
}

// Writes the room's pages [first_page, ...) into prefill pages `pages` (every layer).
void fill(Manager& m, uint64_t room, uint64_t first_page, const std::vector<uint64_t>& pages) {
  const PoolLayout& l = m.layout();
  for (size_t i = 0; i < pages.size(); ++i)
    for (uint32_t b = 0; b < l.num_buffers(); ++b)
      fill_page(l, room, b, (first_page + i) * l.page_size, m.pool_base() + l.page_offset(b, pages[i]));
}

// Mismatched bytes of the room's pages at `pages` on decode, layers [first_layer, end_layer).
uint64_t mismatched(Manager& m, uint64_t room, const std::vector<uint64_t>& pages, uint32_t first_layer = 0,
                    uint32_t end_layer = LayerRange::kToLastLayer) {
  const PoolLayout& l = m.layout();
  uint64_t bad = 0;
  for (size_t i = 0; i < pages.size(); ++i)
    for (uint32_t b = 0; b < l.num_buffers(); ++b) {
      const uint32_t layer = b % l.model.num_layers;
      if (layer < first_layer || layer >= end_layer) continue;
      bad += verify_page(l, room, b, i * l.page_size, m.pool_base() + l.page_offset(b, pages[i]));
    }
  return bad;
}

bool is_bad(const Status& s, const std::string& text) {
  return s.code() == ErrorCode::kInvalidArgument && s.message().find(text) != std::string::npos;
}

class ManagerLayers : public ::testing::TestWithParam<std::string> {};

TEST_P(ManagerLayers, RoomSentLayerByLayerInPageChunksArrivesByteExact) {
  auto r = make_ranks(GetParam());
  ASSERT_TRUE(r);
  Manager& pre = *r->prefill[0];
  const uint64_t room = 91;
  const std::vector<uint64_t> src{3, 1, 4, 0, 2}, dst{9, 5, 12, 7, 6};
  auto rx = r->decode->receiver(room).value();
  auto tx = pre.sender(room).value();
  ASSERT_TRUE(rx->send_metadata(dst, 11, {}, 70).ok());
  ASSERT_TRUE(tx->init(5, 0, 70).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  fill(pre, room, 0, src);
  // Chunk 1 (pages 0-2) one layer at a time; chunk 2 (pages 3-4) in layer groups of 10, 10, 8.
  const uint32_t layers = pre.layout().model.num_layers;
  ASSERT_EQ(layers, 28u);
  for (uint32_t l = 0; l < layers; ++l) ASSERT_TRUE(tx->send(std::span(src).first(3), {l, l + 1}, {}, false).ok()) << l;
  ASSERT_TRUE(tx->send(std::span(src).subspan(3), {0, 10}, {}, false).ok());
  ASSERT_TRUE(tx->send(std::span(src).subspan(3), {10, 20}, {}, false).ok());
  // Every write so far lands before the last layers go: those layers are on decode, no Success.
  ASSERT_TRUE(r->until([&] { return mismatched(*r->decode, room, dst, 0, 20) == 0; }));
  EXPECT_NE(mismatched(*r->decode, room, {dst[3], dst[4]}, 20, 28), 0u) << "layers 20-27 of pages 3-4 are not sent yet";
  EXPECT_EQ(rx->poll(), KVPoll::WaitingForInput);
  EXPECT_EQ(tx->poll(), KVPoll::Transferring);
  ASSERT_TRUE(tx->send(std::span(src).subspan(3), {20, LayerRange::kToLastLayer}, {}, true).ok());
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Success && tx->poll() == KVPoll::Success; }))
      << "prefill " << to_string(tx->poll()) << ", decode " << to_string(rx->poll());
  EXPECT_EQ(mismatched(*r->decode, room, dst), 0u);
  AuxRecord aux;
  std::memcpy(&aux, r->decode->pool_base() + r->decode->layout().aux_offset(11), sizeof aux);
  EXPECT_EQ(aux.room, room);
  EXPECT_EQ(aux.cached_tokens, 70u);
  EXPECT_TRUE(r->until([&] { return tx->release_safe() && rx->release_safe(); }));
  // Each byte went once: the KV bytes of 5 pages and the aux record.
  EXPECT_GT(tx->metrics().bytes, pre.layout().bytes_for_pages(5));
  EXPECT_LE(tx->metrics().bytes, pre.layout().bytes_for_pages(5) + kAuxSlotBytes);
}

TEST_P(ManagerLayers, TwoPrefillRanksToOneDecodeRankLayerByLayer) {
  auto r = make_ranks(GetParam(), 2);
  ASSERT_TRUE(r);
  const uint64_t room = 92;
  const std::vector<uint64_t> src{2, 0, 1}, dst{4, 8, 1};
  auto rx = r->decode->receiver(room).value();
  ASSERT_TRUE(rx->send_metadata(dst, 3, {}).ok());
  std::vector<std::unique_ptr<Sender>> tx;
  for (auto& p : r->prefill) {
    tx.push_back(p->sender(room).value());
    ASSERT_TRUE(tx.back()->init(3, 0).ok());
    fill(*p, room, 0, src);
  }
  EXPECT_EQ(r->prefill[1]->layout().heads_per_rank, 2u);
  ASSERT_TRUE(r->until([&] { return tx[0]->poll() == KVPoll::WaitingForInput && tx[1]->poll() == KVPoll::WaitingForInput; }));
  const uint32_t layers = r->decode->layout().model.num_layers;
  for (uint32_t l = 0; l < layers; ++l)
    for (auto& s : tx) ASSERT_TRUE(s->send(src, {l, l + 1}, {}, l + 1 == layers).ok()) << l;
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Success; })) << to_string(rx->poll());
  EXPECT_EQ(mismatched(*r->decode, room, dst), 0u);
  EXPECT_TRUE(r->until([&] { return tx[0]->poll() == KVPoll::Success && tx[1]->poll() == KVPoll::Success; }));
}

TEST_P(ManagerLayers, FailureInTheMiddleOfALayerWiseRoomFailsItCleanly) {
  auto r = make_ranks(GetParam());
  ASSERT_TRUE(r);
  Manager& pre = *r->prefill[0];
  const uint64_t room = 93;
  const std::vector<uint64_t> src{0, 1}, dst{5, 6};
  auto rx = r->decode->receiver(room).value();
  auto tx = pre.sender(room).value();
  ASSERT_TRUE(rx->send_metadata(dst, 2, {}).ok());
  ASSERT_TRUE(tx->init(2, 0).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  fill(pre, room, 0, src);
  for (uint32_t l = 0; l < 10; ++l) ASSERT_TRUE(tx->send(src, {l, l + 1}, {}, false).ok());
  ASSERT_TRUE(r->until([&] { return mismatched(*r->decode, room, dst, 0, 10) == 0; }));
  // Layer 10's write fails in the transport: the room fails on both sides with prefill's cause.
  pre.faults()->fail_room(room, ErrorCode::kTransferError, "injected: layer 10 lost");
  ASSERT_TRUE(tx->send(src, {10, 11}, {}, false).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed && rx->poll() == KVPoll::Failed; }))
      << "prefill " << to_string(tx->poll()) << ", decode " << to_string(rx->poll());
  ASSERT_TRUE(r->until([&] { return tx->release_safe() && rx->release_safe(); }));
  EXPECT_FALSE(rx->quarantined());
  // Later layers of a failed room are not an error and send nothing: no chunk goes out (the
  // sender stays release-safe) and, once every earlier write settled, no byte is written.
  const uint64_t written = pre.stats().transport.bytes_written;
  for (uint32_t l = 11; l < 28; ++l) EXPECT_TRUE(tx->send(src, {l, l + 1}, {}, l == 27).ok());
  EXPECT_TRUE(tx->release_safe());
  ASSERT_TRUE(r->until([&] { return tx->release_safe(); }));
  EXPECT_EQ(pre.stats().transport.bytes_written, written);
  auto pe = tx->failure(), de = rx->failure();
  ASSERT_TRUE(pe && de);
  EXPECT_EQ(pe->code, ErrorCode::kTransferError);
  EXPECT_EQ(pe->origin, pre.self());
  EXPECT_FALSE(pe->is_from_another_rank);
  EXPECT_EQ(de->code, ErrorCode::kTransferError);
  EXPECT_EQ(de->origin, pre.self());
  EXPECT_TRUE(de->is_from_another_rank);
  AuxRecord aux;
  std::memcpy(&aux, r->decode->pool_base() + r->decode->layout().aux_offset(2), sizeof aux);
  EXPECT_EQ(aux.room, 0u) << "no guard record for a failed room";
}

INSTANTIATE_TEST_SUITE_P(Transports, ManagerLayers, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

TEST(ManagerLayers, RefusedLayerRangesNameTheValueAndSendNothing) {
  auto r = make_ranks("shm");
  ASSERT_TRUE(r);
  Manager& pre = *r->prefill[0];
  auto rx = r->decode->receiver(94).value();
  auto tx = pre.sender(94).value();
  ASSERT_TRUE(rx->send_metadata(std::vector<uint64_t>{0, 1, 2}, 0, {}).ok());
  ASSERT_TRUE(tx->init(3, 0).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  const std::vector<uint64_t> two{0, 1}, one{2}, three{0, 1, 2};
  EXPECT_TRUE(is_bad(tx->send(two, {27, 29}, {}, false), "[27, 29) is past the model's 28 layers"));
  EXPECT_TRUE(is_bad(tx->send(two, {5, 5}, {}, false), "[5, 5) is empty"));
  EXPECT_TRUE(is_bad(tx->send(two, {9, 3}, {}, false), "is empty"));
  EXPECT_EQ(pre.stats().transport.bytes_written, 0u);
  ASSERT_TRUE(tx->send(two, {0, 1}, {}, false).ok());  // layer 0 at page 2, the others at page 0
  EXPECT_TRUE(is_bad(tx->send(two, {0, 2}, {}, false), "layers 0 and 1 of the range [0, 2) stand at pages 2 and 0"));
  EXPECT_TRUE(is_bad(tx->send(two, {0, 1}, {}, false), "2 pages sent of layers [0, 1) plus 2 more exceed its 3 pages"));
  EXPECT_TRUE(is_bad(tx->send(one, {0, 1}, {}, true), "leaves 3 of its 3 pages of layer 1 unsent"));
  EXPECT_TRUE(is_bad(tx->send({}, {}, {}, true), "leaves 1 of its 3 pages of layer 0 unsent"));
  // The refused calls changed nothing: the room completes with what is left.
  ASSERT_TRUE(tx->send(three, {1, LayerRange::kToLastLayer}, {}, false).ok());
  ASSERT_TRUE(tx->send(one, {0, 1}, {}, true).ok());
  EXPECT_TRUE(is_bad(tx->send(one, {0, 1}, {}, false), "after the last chunk"));
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Success && tx->poll() == KVPoll::Success; }))
      << "prefill " << to_string(tx->poll()) << ", decode " << to_string(rx->poll());
}

}  // namespace
}  // namespace kvferry
