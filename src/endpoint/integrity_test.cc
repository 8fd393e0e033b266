// Room digests (endpoint/integrity.h) as pure functions: prefill's digest of the writes it builds
// (coalesce.h) equals decode's digest of what they put in place, however the room's pages are
// chunked; every written byte counts (a flip anywhere in the written regions changes decode's
// digest), a byte outside them does not, and a piece at the wrong place does.
#include "endpoint/integrity.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "endpoint/coalesce.h"

namespace kvferry {
namespace {

ModelGeometry model() {
  ModelGeometry m;
  m.name = "tiny";
  m.num_layers = 3;
  m.tensors_per_layer = 2;
  m.attention = "GQA";
  m.cache_heads = 4;
  m.head_dim = 8;
  m.dtype_bytes = 2;
  return m;
}

struct Side {
  PoolLayout layout;
  std::vector<uint8_t> mem;
  MemoryMap map;
};

Side make_side(uint32_t tp, uint32_t rank, uint64_t seed) {
  Side s;
  auto l = make_layout(model(), tp, rank, 4, 64 << 10, 8);
  EXPECT_TRUE(l.ok()) << l.status().str();
  s.layout = *l;
  s.mem.resize(s.layout.total_bytes());
  std::mt19937_64 rng(seed);
  for (auto& b : s.mem) b = static_cast<uint8_t>(rng());
  s.map = MemoryMap::contiguous(s.layout, s.mem.data());
  return s;
}

// The KV writes one head transfer of the plan makes for `src` -> `dst` pages (as
// PrefillEndpoint::send builds them), appended to `ops`; returns the piece size it hashes with.
uint64_t build_ops(const Side& from, const Side& to, const HeadTransfer& t, std::span<const uint64_t> src,
                   std::span<const uint64_t> dst, std::vector<WriteOp>& ops) {
  const MemoryShape& a = from.map.shape();
  const MemoryShape& b = to.map.shape();
  const uint64_t head_bytes = uint64_t(from.layout.model.head_dim) * from.layout.model.dtype_bytes;
  SliceGeometry g;
  g.page_size = from.layout.page_size;
  g.local_token_bytes = from.layout.token_bytes();
  g.remote_token_bytes = to.layout.token_bytes();
  g.local_off = uint64_t(t.first_head - from.layout.first_head) * head_bytes;
  g.remote_off = uint64_t(t.first_head - to.layout.first_head) * head_bytes;
  g.slice_bytes = uint64_t(t.num_heads) * head_bytes;
  auto runs = coalesce_pages(src, dst);
  PoolOffsets local{a.page_bytes, a.kv_offsets}, remote{b.page_bytes, b.kv_offsets};
  if (g.slice_bytes == g.local_token_bytes && g.slice_bytes == g.remote_token_bytes)
    append_writes(runs, local, remote, ops);
  else
    append_slice_writes(runs, local, remote, g, ops);
  return g.slice_bytes;
}

void apply(const Side& from, Side& to, const std::vector<WriteOp>& ops) {
  for (const WriteOp& op : ops)
    std::memcpy(to.map.pointer(op.remote_offset, op.length), from.map.pointer(op.local_offset, op.length), op.length);
}

uint64_t landed(const Side& to, const std::vector<HeadTransfer>& plan, uint32_t src_tp,
                const std::vector<uint64_t>& dst) {
  SourceRegions r{src_tp, dst, false, 0, {}};
  return landed_digest(to.map, to.layout, plan, to.layout.tp_rank, r);
}

// Equal TP (whole token rows, coalesced runs): the digest does not depend on the chunking.
TEST(Integrity, WholeRowsDigestMatchesWhateverTheChunks) {
  Side p = make_side(1, 0, 1), d = make_side(1, 0, 2);
  auto plan = plan_transfers(model(), 1, 1);
  ASSERT_TRUE(plan.ok());
  const std::vector<uint64_t> src{3, 4, 5, 0, 9, 10}, dst{7, 8, 9, 1, 2, 3};
  uint64_t whole = 0, chunked = 0;
  std::vector<WriteOp> all;
  for (const HeadTransfer& t : *plan) {
    const uint64_t piece = build_ops(p, d, t, src, dst, all);
    whole += ops_digest(p.map, all, piece);
    for (size_t at = 0; at < src.size(); at += 4) {  // chunks of 4 and 2 pages, other runs
      std::vector<WriteOp> ops;
      const size_t n = std::min<size_t>(4, src.size() - at);
      build_ops(p, d, t, std::span(src).subspan(at, n), std::span(dst).subspan(at, n), ops);
      chunked += ops_digest(p.map, ops, piece);
    }
  }
  EXPECT_EQ(whole, chunked);
  EXPECT_NE(landed(d, *plan, 0, dst), whole) << "nothing landed yet";
  apply(p, d, all);
  EXPECT_EQ(landed(d, *plan, 0, dst), whole);
}

// Prefill TP 2 -> decode TP 1: each source writes its head slice of every token row; each
// source's digest matches what it wrote, and every written byte counts.
TEST(Integrity, HeadSlicesEveryWrittenByteCountsAndNoOtherDoes) {
  Side p0 = make_side(2, 0, 3), p1 = make_side(2, 1, 4), d = make_side(1, 0, 5);
  auto plan = plan_transfers(model(), 2, 1);
  ASSERT_TRUE(plan.ok());
  const std::vector<uint64_t> src{1, 0, 2}, dst{5, 9, 2};
  uint64_t sent[2] = {0, 0};
  std::vector<WriteOp> ops[2];
  for (const HeadTransfer& t : *plan) {
    const Side& from = t.prefill_rank == 0 ? p0 : p1;
    const size_t first = ops[t.prefill_rank].size();
    const uint64_t piece = build_ops(from, d, t, src, dst, ops[t.prefill_rank]);
    sent[t.prefill_rank] +=
        ops_digest(from.map, std::span<const WriteOp>(ops[t.prefill_rank]).subspan(first), piece);
  }
  apply(p0, d, ops[0]);
  apply(p1, d, ops[1]);
  for (uint32_t s : {0u, 1u}) ASSERT_EQ(landed(d, *plan, s, dst), sent[s]) << "source " << s;
  // A flip of any byte source 1 wrote changes its digest and not source 0's.
  uint64_t bytes = 0;
  for (const WriteOp& op : ops[1]) {
    bytes += op.length;
    for (uint64_t at : {uint64_t(0), op.length / 2, op.length - 1}) {
      uint8_t* b = d.map.pointer(op.remote_offset + at, 1);
      *b ^= 0x01;
      EXPECT_NE(landed(d, *plan, 1, dst), sent[1]) << "offset " << op.remote_offset + at;
      EXPECT_EQ(landed(d, *plan, 0, dst), sent[0]);
      *b ^= 0x01;
    }
  }
  EXPECT_EQ(bytes, src.size() * d.layout.num_buffers() * d.layout.page_size * d.layout.token_bytes() / 2);
  // A byte of another page (not the room's) counts for nobody.
  *d.map.pointer(d.map.shape().kv(0, 0), 1) ^= 0xff;
  EXPECT_EQ(landed(d, *plan, 0, dst), sent[0]);
  EXPECT_EQ(landed(d, *plan, 1, dst), sent[1]);
}

// Prefill TP 1 -> decode TP 2: one source writes a slice of its wider rows to each decode rank;
// each decode rank's digest of what landed matches what the source sent it.
TEST(Integrity, OneSourceToTwoNarrowerDecodeRanks) {
  Side p = make_side(1, 0, 9), d0 = make_side(2, 0, 10), d1 = make_side(2, 1, 11);
  auto plan = plan_transfers(model(), 1, 2);
  ASSERT_TRUE(plan.ok());
  const std::vector<uint64_t> src{4, 5, 1}, dst{0, 1, 7};
  for (Side* d : {&d0, &d1}) {
    std::vector<WriteOp> ops;
    uint64_t sent = 0;
    for (const HeadTransfer& t : *plan) {
      if (t.decode_rank != d->layout.tp_rank) continue;
      const size_t first = ops.size();
      const uint64_t piece = build_ops(p, *d, t, src, dst, ops);
      sent += ops_digest(p.map, std::span<const WriteOp>(ops).subspan(first), piece);
    }
    ASSERT_FALSE(ops.empty());
    apply(p, *d, ops);
    EXPECT_EQ(landed(*d, *plan, 0, dst), sent) << "decode/tp" << d->layout.tp_rank;
    *d->map.pointer(ops.back().remote_offset + ops.back().length - 1, 1) ^= 0x40;
    EXPECT_NE(landed(*d, *plan, 0, dst), sent);
  }
}

// Position keying: the right bytes at the wrong place (two pages swapped) do not match.
TEST(Integrity, SwappedPagesDoNotMatch) {
  Side p = make_side(1, 0, 6), d = make_side(1, 0, 7);
  auto plan = plan_transfers(model(), 1, 1);
  ASSERT_TRUE(plan.ok());
  const std::vector<uint64_t> src{0, 1}, dst{4, 6};
  std::vector<WriteOp> ops;
  uint64_t sent = 0;
  for (const HeadTransfer& t : *plan) sent += ops_digest(p.map, ops, build_ops(p, d, t, src, dst, ops));
  apply(p, d, ops);
  ASSERT_EQ(landed(d, *plan, 0, dst), sent);
  // Page 4's and page 6's bytes of buffer 2 trade places: every byte is there, at the wrong page.
  const uint64_t bytes = d.map.shape().page_bytes;
  std::vector<uint8_t> tmp(bytes);
  uint8_t* a = d.map.pointer(d.map.shape().kv(2, 4), bytes);
  uint8_t* b = d.map.pointer(d.map.shape().kv(2, 6), bytes);
  std::memcpy(tmp.data(), a, bytes);
  std::memcpy(a, b, bytes);
  std::memcpy(b, tmp.data(), bytes);
  EXPECT_NE(landed(d, *plan, 0, dst), sent);
}

// The final rows (aux, state, guard) are pieces of their own, seeded by their place.
TEST(Integrity, FinalRowsAreCoveredForTheLowestSourceOnly) {
  Side d = make_side(1, 0, 8);
  auto plan = plan_transfers(model(), 1, 1);
  ASSERT_TRUE(plan.ok());
  const std::vector<uint64_t> dst{1};
  SourceRegions kv_only{0, dst, false, 3, {}}, with_final{0, dst, true, 3, {}};
  const uint64_t a = landed_digest(d.map, d.layout, *plan, 0, kv_only);
  const uint64_t b = landed_digest(d.map, d.layout, *plan, 0, with_final);
  const uint8_t* guard = d.map.guard_row(3);
  EXPECT_EQ(b - a, piece_digest(guard, sizeof(AuxRecord), d.map.shape().guard(3)));
  *d.map.guard_row(3) ^= 0x10;
  EXPECT_EQ(landed_digest(d.map, d.layout, *plan, 0, kv_only), a);
  EXPECT_NE(landed_digest(d.map, d.layout, *plan, 0, with_final), b);
}

}  // namespace
}  // namespace kvferry
