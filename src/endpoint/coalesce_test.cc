#include "endpoint/coalesce.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

TEST(Coalesce, MergesRunsWhereBothSidesAdvanceByOne) {
  auto runs = coalesce_pages({0, 1, 2, 7, 8, 3}, {10, 11, 12, 13, 14, 20});
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].src, 0u);
  EXPECT_EQ(runs[0].dst, 10u);
  EXPECT_EQ(runs[0].pages, 3u);
  EXPECT_EQ(runs[1].src, 7u);
  EXPECT_EQ(runs[1].dst, 13u);
  EXPECT_EQ(runs[1].pages, 2u);
  EXPECT_EQ(runs[2].src, 3u);
  EXPECT_EQ(runs[2].dst, 20u);
  EXPECT_EQ(runs[2].pages, 1u);
}

TEST(Coalesce, DstGapBreaksRun) {
  auto runs = coalesce_pages({0, 1}, {5, 7});
  EXPECT_EQ(runs.size(), 2u);
}

// Offsets of evenly spaced buffers (a contiguous pool).
std::vector<uint64_t> strided(uint64_t stride, size_t n) {
  std::vector<uint64_t> v;
  for (size_t b = 0; b < n; ++b) v.push_back(b * stride);
  return v;
}

TEST(Coalesce, WritesPerBufferUseEachSidesStride) {
  std::vector<PageRun> runs{{2, 5, 3}};
  const auto l = strided(1000, 2), r = strided(5000, 2);
  auto ops = runs_to_writes(runs, {100, l}, {100, r});
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].local_offset, 200u);
  EXPECT_EQ(ops[0].remote_offset, 500u);
  EXPECT_EQ(ops[0].length, 300u);
  EXPECT_EQ(ops[1].local_offset, 1200u);
  EXPECT_EQ(ops[1].remote_offset, 5500u);
}

TEST(Coalesce, AppendFormsAddToOneBatch) {
  std::vector<PageRun> runs{{2, 5, 1}};
  std::vector<WriteOp> ops{{1, 2, 3}};
  const auto l2 = strided(1000, 2), r2 = strided(5000, 2), l1 = strided(1000, 1), r1 = strided(5000, 1);
  append_writes(runs, {100, l2}, {100, r2}, ops);
  SliceGeometry g;
  g.page_size = 2;
  g.local_token_bytes = 50;
  g.remote_token_bytes = 25;
  g.local_off = 25;
  g.slice_bytes = 25;
  append_slice_writes(runs, {100, l1}, {50, r1}, g, ops);
  ASSERT_EQ(ops.size(), 5u);
  EXPECT_EQ(ops[0].length, 3u);  // kept
  EXPECT_EQ(ops[2].local_offset, 1200u);
  EXPECT_EQ(ops[2].remote_offset, 5500u);
  // Token 0 and 1 of local page 2 (second half of each 50-byte row) to remote page 5's rows.
  EXPECT_EQ(ops[3].local_offset, 225u);
  EXPECT_EQ(ops[3].remote_offset, 250u);
  EXPECT_EQ(ops[4].local_offset, 275u);
  EXPECT_EQ(ops[4].remote_offset, 275u);
  EXPECT_EQ(ops[4].length, 25u);
  // A slice of kv_indices read in place.
  std::vector<uint64_t> kv{9, 3, 4, 5, 9};
  std::vector<uint64_t> src{0, 1, 2};
  auto r = coalesce_pages(std::span<const uint64_t>(src), std::span<const uint64_t>(kv).subspan(1, 3));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].dst, 3u);
  EXPECT_EQ(r[0].pages, 3u);
}

TEST(Coalesce, SeparateBuffersUseTheirOwnOffsets) {
  // Engine buffers are separate allocations: buffer offsets in any order, unevenly spaced.
  const std::vector<uint64_t> local{70000, 0, 30000};
  const std::vector<uint64_t> remote{5, 900000, 123456};
  auto ops = runs_to_writes({{1, 4, 2}}, {64, local}, {64, remote});
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].local_offset, 70064u);
  EXPECT_EQ(ops[0].remote_offset, 5u + 256);
  EXPECT_EQ(ops[0].length, 128u);
  EXPECT_EQ(ops[1].local_offset, 64u);
  EXPECT_EQ(ops[1].remote_offset, 900256u);
  EXPECT_EQ(ops[2].local_offset, 30064u);
  EXPECT_EQ(ops[2].remote_offset, 123712u);
  // Head slices (unequal TP) go to the same per-buffer offsets.
  SliceGeometry g;
  g.page_size = 2;
  g.local_token_bytes = 32;
  g.remote_token_bytes = 16;
  g.local_off = 16;
  g.slice_bytes = 16;
  auto sl = runs_to_slice_writes({{1, 4, 1}}, {64, local}, {32, remote}, g);
  ASSERT_EQ(sl.size(), 6u);  // 2 tokens x 3 buffers
  EXPECT_EQ(sl[0].local_offset, 70064u + 16);
  EXPECT_EQ(sl[0].remote_offset, 5u + 128);
  EXPECT_EQ(sl[1].local_offset, 70064u + 32 + 16);
  EXPECT_EQ(sl[1].remote_offset, 5u + 128 + 16);
  EXPECT_EQ(sl[4].local_offset, 30064u + 16);
  EXPECT_EQ(sl[4].remote_offset, 123456u + 128);
}

TEST(Coalesce, LayerBuffersAreEveryTensorOfTheLayer) {
  // 3 layers x 2 tensors: K0 K1 K2 V0 V1 V2 (every layer's K, then every layer's V).
  const std::vector<uint64_t> offsets{100, 200, 300, 400, 500, 600};
  EXPECT_EQ(layer_buffer_offsets(offsets, 3, 1, 2), (std::vector<uint64_t>{200, 500}));
  EXPECT_EQ(layer_buffer_offsets(offsets, 3, 0, 2), (std::vector<uint64_t>{100, 200, 400, 500}));
  EXPECT_EQ(layer_buffer_offsets(offsets, 3, 0, 3), offsets);
  // MLA: one latent buffer per layer.
  EXPECT_EQ(layer_buffer_offsets(std::vector<uint64_t>{7, 8}, 2, 1, 2), (std::vector<uint64_t>{8}));
}

}  // namespace
}  // namespace kvferry
