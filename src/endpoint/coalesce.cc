#include "endpoint/coalesce.h"

#include <algorithm>

namespace kvferry {

std::vector<PageRun> coalesce_pages(std::span<const uint64_t> src, std::span<const uint64_t> dst) {
  std::vector<PageRun> runs;
  // At most one run a page: one allocation, not a chain of regrowths and copies.
  runs.reserve(std::min(src.size(), dst.size()));
  for (size_t i = 0; i < src.size() && i < dst.size(); ++i) {
    if (!runs.empty()) {
      PageRun& r = runs.back();
      if (src[i] == r.src + r.pages && dst[i] == r.dst + r.pages) {
        ++r.pages;
        continue;
      }
    }
    runs.push_back({src[i], dst[i], 1});
  }
  return runs;
}

std::vector<PageRun> coalesce_pages(const std::vector<uint64_t>& src, const std::vector<uint64_t>& dst) {
  return coalesce_pages(std::span<const uint64_t>(src), std::span<const uint64_t>(dst));
}

std::vector<uint64_t> layer_buffer_offsets(std::span<const uint64_t> offsets, uint32_t num_layers, uint32_t begin,
                                           uint32_t end) {
  std::vector<uint64_t> out;
  if (num_layers == 0) return out;
  for (size_t b = 0; b < offsets.size(); ++b) {
    const uint32_t layer = static_cast<uint32_t>(b % num_layers);
    if (layer >= begin && layer < end) out.push_back(offsets[b]);
  }
  return out;
}

namespace {
size_t buffers_of(const PoolOffsets& a, const PoolOffsets& b) {
  return std::min(a.buffer_offsets.size(), b.buffer_offsets.size());
}
}  // namespace

void append_writes(const std::vector<PageRun>& runs, const PoolOffsets& local, const PoolOffsets& remote,
                   std::vector<WriteOp>& ops) {
  const size_t num_buffers = buffers_of(local, remote);
  ops.reserve(ops.size() + runs.size() * num_buffers);
  for (size_t b = 0; b < num_buffers; ++b) {
    for (const PageRun& r : runs) {
      ops.push_back({local.buffer_offsets[b] + r.src * local.page_bytes,
                     remote.buffer_offsets[b] + r.dst * remote.page_bytes, r.pages * local.page_bytes});
    }
  }
}

std::vector<WriteOp> runs_to_writes(const std::vector<PageRun>& runs, const PoolOffsets& local,
                                    const PoolOffsets& remote) {
  std::vector<WriteOp> ops;
  append_writes(runs, local, remote, ops);
  return ops;
}

void append_slice_writes(const std::vector<PageRun>& runs, const PoolOffsets& local, const PoolOffsets& remote,
                         const SliceGeometry& g, std::vector<WriteOp>& ops) {
  const size_t num_buffers = buffers_of(local, remote);
  uint64_t tokens = 0;
  for (const PageRun& r : runs) tokens += r.pages * g.page_size;
  ops.reserve(ops.size() + tokens * num_buffers * (g.rotate_heads > 1 ? g.rotate_heads : 1));
  for (size_t b = 0; b < num_buffers; ++b) {
    for (const PageRun& r : runs) {
      for (uint64_t t = 0; t < r.pages * g.page_size; ++t) {
        uint64_t src = local.buffer_offsets[b] + r.src * local.page_bytes + t * g.local_token_bytes + g.local_off;
        uint64_t dst =
            remote.buffer_offsets[b] + r.dst * remote.page_bytes + t * g.remote_token_bytes + g.remote_off;
        if (g.rotate_heads > 1) {
          for (uint32_t k = 0; k < g.rotate_heads; ++k)
            ops.push_back({src + ((k + 1) % g.rotate_heads) * g.head_bytes, dst + k * g.head_bytes, g.head_bytes});
        } else {
          ops.push_back({src, dst, g.slice_bytes});
        }
      }
    }
  }
}

std::vector<WriteOp> runs_to_slice_writes(const std::vector<PageRun>& runs, const PoolOffsets& local,
                                          const PoolOffsets& remote, const SliceGeometry& g) {
  std::vector<WriteOp> ops;
  append_slice_writes(runs, local, remote, g, ops);
  return ops;
}

}  // namespace kvferry
