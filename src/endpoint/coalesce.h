// Coalescing (src page, dst page) pairs into runs where both advance by one, then into one write
// per run per KV buffer (docs/transport.md). Each side's KV buffers are at their own offsets in
// that side's offset space (engine buffers are separate allocations; a contiguous pool is the
// special case of evenly spaced offsets).
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kvferry/transport.h"

namespace kvferry {

struct PageRun {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t pages = 0;
};

// Pairs src[i] -> dst[i]; sizes must match (the caller checks). The span form reads a slice of a
// room's kv_indices in place (no copy per chunk).
std::vector<PageRun> coalesce_pages(std::span<const uint64_t> src, std::span<const uint64_t> dst);
std::vector<PageRun> coalesce_pages(const std::vector<uint64_t>& src, const std::vector<uint64_t>& dst);

// One side's KV buffers for offset computation: buffer b, page p is at
// buffer_offsets[b] + p * page_bytes (endpoint/memory_map.h MemoryShape::kv).
struct PoolOffsets {
  uint64_t page_bytes = 0;
  std::span<const uint64_t> buffer_offsets;
};

// The offsets of the KV buffers of layers [begin, end) (kvferry/geometry.h LayerRange: buffer b
// holds layer b % num_layers), in buffer order; `offsets` has num_layers x tensors entries.
std::vector<uint64_t> layer_buffer_offsets(std::span<const uint64_t> offsets, uint32_t num_layers, uint32_t begin,
                                           uint32_t end);

// One WriteOp per run per KV buffer, for the buffers both sides have (the caller checked they
// have the same number). The append_ forms add to `out` (one batch for every layer and every head
// transfer of a chunk, no temporary vectors).
std::vector<WriteOp> runs_to_writes(const std::vector<PageRun>& runs, const PoolOffsets& local,
                                    const PoolOffsets& remote);
void append_writes(const std::vector<PageRun>& runs, const PoolOffsets& local, const PoolOffsets& remote,
                   std::vector<WriteOp>& out);

// A head slice moved between ranks holding different head ranges: per token, `slice_bytes` from
// byte `local_off` of the local token row to byte `remote_off` of the remote token row. One write
// per token per buffer (rows are strided differently on the two sides). With `rotate_heads` > 1
// (test-only: a deliberately wrong head offset) head k of the slice is taken from head
// (k + 1) % rotate_heads, which verification must catch.
struct SliceGeometry {
  uint32_t page_size = 1;          // tokens
  uint64_t local_token_bytes = 0;  // bytes of one token row in the local pool
  uint64_t remote_token_bytes = 0;
  uint64_t local_off = 0;
  uint64_t remote_off = 0;
  uint64_t slice_bytes = 0;
  uint32_t rotate_heads = 0;
  uint64_t head_bytes = 0;
};
std::vector<WriteOp> runs_to_slice_writes(const std::vector<PageRun>& runs, const PoolOffsets& local,
                                          const PoolOffsets& remote, const SliceGeometry& g);
void append_slice_writes(const std::vector<PageRun>& runs, const PoolOffsets& local, const PoolOffsets& remote,
                         const SliceGeometry& g, std::vector<WriteOp>& out);

}  // namespace kvferry
