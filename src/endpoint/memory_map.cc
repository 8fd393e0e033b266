#include "endpoint/memory_map.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace kvferry {
namespace {

bool mul_ok(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool add_ok(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

}  // namespace

MemoryMap MemoryMap::contiguous(const PoolLayout& l, uint8_t* external) {
  MemoryMap m;
  m.transport_allocates_ = external == nullptr;
  MemoryShape& s = m.shape_;
  s.page_size = l.page_size;
  s.page_bytes = l.page_bytes();
  s.num_pages = l.num_pages;
  for (uint32_t b = 0; b < l.num_buffers(); ++b) s.kv_offsets.push_back(l.page_offset(b, 0));
  s.aux_rows = l.aux_slots;
  s.guard_offset = l.aux_offset(0);
  m.spans_.push_back({external, l.total_bytes(), 0, MemoryKind::kHost});
  return m;
}

void MemoryMap::bind_region(uint8_t* base) {
  if (!spans_.empty()) spans_.front().base = base;
}

Result<MemoryMap> MemoryMap::from_buffers(const BufferSet& set, uint32_t page_size, uint64_t guard_rows,
                                          uint8_t* guard_memory) {
  auto bad = [](const std::string& s) { return Status(ErrorCode::kInvalidArgument, s); };
  if (guard_rows == 0) return bad("no aux index: at least one guard row is needed");
  if (!set.aux.empty() && guard_rows != set.aux_rows)
    return bad(fmt::format("{} guard rows for {} aux rows (one guard row per aux index)", guard_rows, set.aux_rows));
  uint64_t guard_bytes = 0;
  if (!mul_ok(guard_rows, kAuxSlotBytes, &guard_bytes)) return bad("guard rows overflow");
  MemoryMap m;
  if (guard_memory == nullptr) {
    m.own_guard_.reset(new uint8_t[guard_bytes]());
    guard_memory = m.own_guard_.get();
  }
  const uint64_t g = reinterpret_cast<uint64_t>(guard_memory);
  if (g > UINT64_MAX - guard_bytes) return bad("guard memory wraps around");
  struct Item {
    const BufferDesc* desc;
    uint64_t* offset;
  };
  MemoryShape& s = m.shape_;
  s.page_size = page_size;
  s.page_bytes = set.page_bytes;
  s.num_pages = set.num_pages;
  s.aux_rows = guard_rows;
  s.state_rows = set.state_rows;
  s.kv_offsets.resize(set.kv.size());
  s.aux_offsets.resize(set.aux.size());
  s.state_offsets.resize(set.state.size());
  s.aux_item_bytes = set.aux_item_bytes();
  s.state_item_bytes = set.state_item_bytes();
  BufferDesc guard{g, guard_bytes, kAuxSlotBytes, BufferKind::kAux, MemoryKind::kHost};
  std::vector<Item> items;
  for (size_t i = 0; i < set.kv.size(); ++i) items.push_back({&set.kv[i], &s.kv_offsets[i]});
  for (size_t i = 0; i < set.aux.size(); ++i) items.push_back({&set.aux[i], &s.aux_offsets[i]});
  for (size_t i = 0; i < set.state.size(); ++i) items.push_back({&set.state[i], &s.state_offsets[i]});
  items.push_back({&guard, &s.guard_offset});
  uint64_t lowest = UINT64_MAX;
  for (const Item& it : items) lowest = std::min(lowest, it.desc->address);
  for (const Item& it : items) {
    const BufferDesc& d = *it.desc;
    if (it.desc == &guard) {
      for (const Item& other : items)
        if (other.desc != &guard && d.address < other.desc->address + other.desc->bytes &&
            other.desc->address < d.address + d.bytes)
          return bad("guard memory overlaps a " + std::string(buffer_kind_name(other.desc->kind)) + " buffer");
    }
    *it.offset = d.address - lowest;
    m.spans_.push_back({reinterpret_cast<uint8_t*>(d.address), d.bytes, d.address - lowest, d.memory});
  }
  return m;
}

uint8_t* MemoryMap::pointer(uint64_t offset, uint64_t bytes) const {
  for (const MapSpan& s : spans_) {
    if (s.base == nullptr || offset < s.offset) continue;
    const uint64_t in = offset - s.offset;
    if (in <= s.bytes && bytes <= s.bytes - in) return s.base + in;
  }
  return nullptr;
}

std::string check_shape_in_spans(const MemoryShape& shape, const std::vector<SpanExtent>& spans) {
  std::vector<SpanExtent> sorted = spans;
  std::sort(sorted.begin(), sorted.end(), [](const SpanExtent& a, const SpanExtent& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    uint64_t end = 0;
    if (sorted[i].bytes == 0) return fmt::format("span at offset {} is empty", sorted[i].offset);
    if (!add_ok(sorted[i].offset, sorted[i].bytes, &end)) return fmt::format("span at offset {} wraps", sorted[i].offset);
    if (i + 1 < sorted.size() && sorted[i + 1].offset < end)
      return fmt::format("spans at offsets {} and {} overlap", sorted[i].offset, sorted[i + 1].offset);
  }
  // [offset, offset + count * item) inside one span.
  auto inside = [&](uint64_t offset, uint64_t count, uint64_t item) {
    uint64_t bytes = 0, end = 0;
    if (!mul_ok(count, item, &bytes) || !add_ok(offset, bytes, &end)) return false;
    for (const SpanExtent& s : sorted)
      if (offset >= s.offset && end <= s.offset + s.bytes) return true;
    return false;
  };
  for (size_t b = 0; b < shape.kv_offsets.size(); ++b)
    if (!inside(shape.kv_offsets[b], shape.num_pages, shape.page_bytes))
      return fmt::format("kv buffer {} ({} pages of {} bytes at offset {}) is not inside a registered span", b,
                         shape.num_pages, shape.page_bytes, shape.kv_offsets[b]);
  for (size_t a = 0; a < shape.aux_offsets.size(); ++a)
    if (a >= shape.aux_item_bytes.size() || !inside(shape.aux_offsets[a], shape.aux_rows, shape.aux_item_bytes[a]))
      return fmt::format("aux buffer {} ({} rows at offset {}) is not inside a registered span", a, shape.aux_rows,
                         shape.aux_offsets[a]);
  for (size_t s = 0; s < shape.state_offsets.size(); ++s)
    if (s >= shape.state_item_bytes.size() ||
        !inside(shape.state_offsets[s], shape.state_rows, shape.state_item_bytes[s]))
      return fmt::format("state buffer {} ({} rows at offset {}) is not inside a registered span", s,
                         shape.state_rows, shape.state_offsets[s]);
  if (!inside(shape.guard_offset, shape.aux_rows, kAuxSlotBytes))
    return fmt::format("guard rows ({} at offset {}) are not inside a registered span", shape.aux_rows,
                       shape.guard_offset);
  return "";
}

}  // namespace kvferry
