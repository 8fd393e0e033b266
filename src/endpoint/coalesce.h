// Coalescing (src page, dst page) pairs into runs where both advance by one (DESIGN §2 step 5),
// then into one write per run per layer buffer.
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

// Geometry of one side's pool for offset computation: buffer b, page p is at
// b * buffer_stride + p * page_bytes.
struct PoolStrides {
  uint64_t page_bytes = 0;
  uint64_t buffer_stride = 0;
};

// One WriteOp per run per buffer, buffers [0, num_buffers). The append_ forms add to `out` (one
// batch for every layer and every head transfer of a chunk, no temporary vectors).
std::vector<WriteOp> runs_to_writes(const std::vector<PageRun>& runs, uint32_t num_buffers,
                                    const PoolStrides& local, const PoolStrides& remote);
void append_writes(const std::vector<PageRun>& runs, uint32_t num_buffers, const PoolStrides& local,
                   const PoolStrides& remote, std::vector<WriteOp>& out);

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
std::vector<WriteOp> runs_to_slice_writes(const std::vector<PageRun>& runs, uint32_t num_buffers,
                                          const PoolStrides& local, const PoolStrides& remote,
                                          const SliceGeometry& g);
void append_slice_writes(const std::vector<PageRun>& runs, uint32_t num_buffers, const PoolStrides& local,
                         const PoolStrides& remote, const SliceGeometry& g, std::vector<WriteOp>& out);

}  // namespace kvferry
