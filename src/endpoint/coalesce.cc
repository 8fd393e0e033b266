#include "endpoint/coalesce.h"

namespace kvferry {

std::vector<PageRun> coalesce_pages(const std::vector<uint64_t>& src, const std::vector<uint64_t>& dst) {
  std::vector<PageRun> runs;
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

std::vector<WriteOp> runs_to_writes(const std::vector<PageRun>& runs, uint32_t num_buffers,
                                    const PoolStrides& local, const PoolStrides& remote) {
  std::vector<WriteOp> ops;
  ops.reserve(runs.size() * num_buffers);
  for (uint32_t b = 0; b < num_buffers; ++b) {
    for (const PageRun& r : runs) {
      ops.push_back({b * local.buffer_stride + r.src * local.page_bytes,
                     b * remote.buffer_stride + r.dst * remote.page_bytes, r.pages * local.page_bytes});
    }
  }
  return ops;
}

}  // namespace kvferry
