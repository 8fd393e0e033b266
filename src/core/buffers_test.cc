#include "kvferry/buffers.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvferry {
namespace {

BufferDesc kv(uint64_t address, uint64_t bytes, uint64_t item) { return {address, bytes, item, BufferKind::kKv}; }
BufferDesc aux(uint64_t address, uint64_t bytes, uint64_t item) { return {address, bytes, item, BufferKind::kAux}; }
BufferDesc state(uint64_t address, uint64_t bytes, uint64_t item) {
  return {address, bytes, item, BufferKind::kState};
}

TEST(Buffers, SortsByKindInOrderAndCountsItems) {
  auto set = check_buffers({kv(0x10000, 4096, 512), aux(0x90000, 64 * 8, 8), kv(0x20000, 8192, 512),
                            state(0xa0000, 300, 100), aux(0x80000, 64 * 32, 32)});
  ASSERT_TRUE(set.ok()) << set.status().str();
  ASSERT_EQ(set->kv.size(), 2u);
  EXPECT_EQ(set->kv[0].address, 0x10000u);
  EXPECT_EQ(set->kv[1].address, 0x20000u);
  EXPECT_EQ(set->page_bytes, 512u);
  EXPECT_EQ(set->num_pages, 8u);  // min(4096, 8192) / 512
  ASSERT_EQ(set->aux.size(), 2u);
  EXPECT_EQ(set->aux_rows, 64u);
  EXPECT_EQ(set->aux_item_bytes(), (std::vector<uint64_t>{8, 32}));
  EXPECT_EQ(set->state_rows, 3u);
  EXPECT_EQ(set->state_item_bytes(), (std::vector<uint64_t>{100}));
}

TEST(Buffers, NoAuxOrStateBuffersIsFine) {
  auto set = check_buffers({kv(0x1000, 1024, 256)});
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->aux_rows, 0u);
  EXPECT_EQ(set->state_rows, 0u);
  EXPECT_EQ(set->num_pages, 4u);
}

void expect_refused(const std::vector<BufferDesc>& b, const std::string& needle) {
  auto set = check_buffers(b);
  ASSERT_FALSE(set.ok()) << "accepted, expected: " << needle;
  EXPECT_EQ(set.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find(needle), std::string::npos) << set.status().message();
}

TEST(Buffers, RefusesBadBuffersNamingThem) {
  expect_refused({}, "no kv buffer");
  expect_refused({aux(0x1000, 64, 8)}, "no kv buffer");
  expect_refused({kv(0, 1024, 256)}, "kv buffer 0: null address");
  expect_refused({kv(0x1000, 0, 256)}, "kv buffer 0: zero bytes");
  expect_refused({kv(0x1000, 1024, 0)}, "kv buffer 0: zero item_bytes");
  expect_refused({kv(0x1000, 100, 256)}, "kv buffer 0: 100 bytes cannot hold one item");
  expect_refused({kv(0x1000, 1024, 256), kv(0x9000, 1024, 128)}, "kv buffer 1: item_bytes 128 differs");
  expect_refused({kv(UINT64_MAX - 100, 1024, 256)}, "wraps");
  expect_refused({kv(0x1000, 1024, 256), aux(0x1200, 64, 8)}, "kv buffer 0 overlaps aux buffer 0");
  expect_refused({kv(0x1000, 1024, 256), state(0x2000, 64, 8), state(0x2020, 64, 8)},
                 "state buffer 0 overlaps state buffer 1");
}

// Device ordinals are bounded before any runtime sees them; whether the device exists is
// registration's check (src/device/device_buffers.h).
TEST(Buffers, ChecksDeviceOrdinals) {
  auto on = [](BufferDesc b, MemoryKind m, int32_t device) {
    b.memory = m;
    b.device = device;
    return b;
  };
  expect_refused({on(kv(0x1000, 1024, 256), MemoryKind::kCuda, -1)},
                 "kv buffer 0: cuda device ordinal -1 outside [0, 64)");
  expect_refused({kv(0x1000, 1024, 256), on(aux(0x9000, 64, 8), MemoryKind::kCuda, kMaxCudaDevices)},
                 "aux buffer 0: cuda device ordinal 64 outside");
  expect_refused({on(kv(0x1000, 1024, 256), MemoryKind::kHost, 2)}, "kv buffer 0: host memory names cuda device 2");
  auto set = check_buffers({on(kv(0x1000, 1024, 256), MemoryKind::kCuda, 7), aux(0x9000, 64, 8)});
  ASSERT_TRUE(set.ok()) << set.status().str();  // KV on device 7, aux rows on the host
  EXPECT_EQ(set->kv[0].device, 7);
  EXPECT_EQ(set->aux[0].memory, MemoryKind::kHost);
}

TEST(Buffers, AdjacentBuffersDoNotOverlap) {
  EXPECT_TRUE(check_buffers({kv(0x1000, 1024, 256), kv(0x1400, 1024, 256)}).ok());
}

TEST(Buffers, BoundsTheNumberOfBuffers) {
  std::vector<BufferDesc> b{kv(0x1000, 1024, 256)};
  for (uint32_t i = 0; i <= kMaxAuxBuffers; ++i) b.push_back(aux(0x100000 + i * 64, 64, 8));
  expect_refused(b, "more than 64 aux buffers");
}

TEST(Buffers, ContiguousPoolListsOneBufferPerLayerTensor) {
  ModelGeometry m{"toy", "GQA", 3, 2, 4, 8, 2};
  auto l = make_layout(m, 1, 0, 4, 1 << 20, 16);
  ASSERT_TRUE(l.ok());
  std::vector<uint8_t> pool(l->total_bytes());
  auto list = contiguous_pool_buffers(pool.data(), *l);
  ASSERT_EQ(list.size(), 6u);
  auto set = check_buffers(list);
  ASSERT_TRUE(set.ok()) << set.status().str();
  EXPECT_EQ(set->num_pages, l->num_pages);
  EXPECT_EQ(set->page_bytes, l->page_bytes());
  EXPECT_EQ(set->kv[5].address, reinterpret_cast<uint64_t>(pool.data()) + 5 * l->buffer_bytes());
  EXPECT_TRUE(set->aux.empty());  // the layout's aux slots are kvferry's guard rows
}

}  // namespace
}  // namespace kvferry
