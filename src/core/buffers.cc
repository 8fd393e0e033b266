#include "kvferry/buffers.h"

#include <algorithm>
#include <string>

namespace kvferry {
namespace {

std::string name_of(const BufferDesc& b, size_t index) {
  return std::string(buffer_kind_name(b.kind)) + " buffer " + std::to_string(index);
}

Status bad(const std::string& what) { return Status(ErrorCode::kInvalidArgument, what); }

// Rows of the smallest buffer of a kind (0 when there is none).
uint64_t min_items(const std::vector<BufferDesc>& v) {
  uint64_t n = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const uint64_t items = v[i].bytes / v[i].item_bytes;
    n = i == 0 ? items : std::min(n, items);
  }
  return n;
}

std::vector<uint64_t> item_bytes_of(const std::vector<BufferDesc>& v) {
  std::vector<uint64_t> out;
  out.reserve(v.size());
  for (const BufferDesc& b : v) out.push_back(b.item_bytes);
  return out;
}

}  // namespace

std::string_view buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::kKv: return "kv";
    case BufferKind::kAux: return "aux";
    case BufferKind::kState: return "state";
  }
  return "unknown";
}

std::string_view memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kCuda: return "cuda";
  }
  return "unknown";
}

std::vector<uint64_t> BufferSet::aux_item_bytes() const { return item_bytes_of(aux); }
std::vector<uint64_t> BufferSet::state_item_bytes() const { return item_bytes_of(state); }

Result<BufferSet> check_buffers(const std::vector<BufferDesc>& buffers) {
  BufferSet set;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  ranges.reserve(buffers.size());
  for (const BufferDesc& b : buffers) {
    std::vector<BufferDesc>* list = nullptr;
    uint32_t bound = 0;
    switch (b.kind) {
      case BufferKind::kKv: list = &set.kv; bound = kMaxKvBuffers; break;
      case BufferKind::kAux: list = &set.aux; bound = kMaxAuxBuffers; break;
      case BufferKind::kState: list = &set.state; bound = kMaxStateBuffers; break;
    }
    if (list == nullptr) return bad("a buffer of unknown kind " + std::to_string(static_cast<int>(b.kind)));
    if (b.memory != MemoryKind::kHost && b.memory != MemoryKind::kCuda)
      return bad("a buffer of unknown memory kind " + std::to_string(static_cast<int>(b.memory)));
    const std::string name = name_of(b, list->size());
    if (list->size() >= bound)
      return bad("more than " + std::to_string(bound) + " " + std::string(buffer_kind_name(b.kind)) + " buffers");
    if (b.address == 0) return bad(name + ": null address");
    if (b.bytes == 0) return bad(name + ": zero bytes");
    if (b.item_bytes == 0) return bad(name + ": zero item_bytes");
    if (b.bytes < b.item_bytes)
      return bad(name + ": " + std::to_string(b.bytes) + " bytes cannot hold one item of " +
                 std::to_string(b.item_bytes));
    if (b.address > UINT64_MAX - b.bytes) return bad(name + ": address range wraps around");
    if (b.memory == MemoryKind::kCuda && (b.device < 0 || b.device >= kMaxCudaDevices))
      return bad(name + ": cuda device ordinal " + std::to_string(b.device) + " outside [0, " +
                 std::to_string(kMaxCudaDevices) + ")");
    if (b.memory == MemoryKind::kHost && b.device != 0)
      return bad(name + ": host memory names cuda device " + std::to_string(b.device) + " (host buffers take 0)");
    if (b.kind == BufferKind::kKv && !set.kv.empty() && b.item_bytes != set.kv.front().item_bytes)
      return bad(name + ": item_bytes " + std::to_string(b.item_bytes) + " differs from kv buffer 0's " +
                 std::to_string(set.kv.front().item_bytes) + " (every KV buffer holds the same pages)");
    ranges.push_back({b.address, b.address + b.bytes, name});
    list->push_back(b);
  }
  if (set.kv.empty()) return bad("no kv buffer");
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end) return bad(ranges[i - 1].name + " overlaps " + ranges[i].name);
  set.page_bytes = set.kv.front().item_bytes;
  set.num_pages = min_items(set.kv);
  set.aux_rows = min_items(set.aux);
  set.state_rows = min_items(set.state);
  return set;
}

std::vector<BufferDesc> contiguous_pool_buffers(uint8_t* base, const PoolLayout& layout) {
  std::vector<BufferDesc> out;
  out.reserve(layout.num_buffers());
  const uint64_t a = reinterpret_cast<uint64_t>(base);
  for (uint32_t b = 0; b < layout.num_buffers(); ++b)
    out.push_back({a + layout.page_offset(b, 0), layout.buffer_bytes(), layout.page_bytes(), BufferKind::kKv,
                   MemoryKind::kHost});
  return out;
}

}  // namespace kvferry
