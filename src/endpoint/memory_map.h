// The rank's memory map: where every buffer of the rank lies in its offset space (the union of the
// spans it registers with the transport, each placed at an offset; WriteOp offsets are in it).
//
// MemoryShape is what a pool registration declares about a rank (kvferry/messages.h
// PoolRegistration): each buffer's offset and item size, so the same offset helpers serve the
// local map and a peer's. Guard rows (kvferry's AuxRecord per aux index, kAuxSlotBytes each) are
// part of it.
//
// Two ways to build a map:
//   contiguous(layout)  today's fast path: one span of layout.total_bytes() at offset 0, allocated
//                       by the transport (create_region) or given by the caller (a numpy pool);
//                       KV buffer b at layout.page_offset(b, 0), guard rows at the layout's aux slots.
//   from_buffers(set)   the engine's own buffers (kvferry/buffers.h), one span each at
//                       offset = address - lowest address (the offset space mirrors the address
//                       layout), plus one span of guard rows: in memory the caller gives, or
//                       allocated here.
// Thread contract: built once, then read-only (any thread).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvferry/buffers.h"
#include "kvferry/error.h"
#include "kvferry/geometry.h"

namespace kvferry {

// Offsets of a rank's buffers in its offset space. Units: bytes; rows and pages are indices.
struct MemoryShape {
  uint32_t page_size = 0;                // tokens per page
  uint64_t page_bytes = 0;               // item_bytes of every KV buffer
  uint64_t num_pages = 0;                // pages of every KV buffer
  std::vector<uint64_t> kv_offsets;      // one per KV buffer, in layer-tensor order
  std::vector<uint64_t> aux_offsets;     // one per aux buffer
  std::vector<uint64_t> aux_item_bytes;  // row bytes of each aux buffer
  uint64_t aux_rows = 0;                 // aux indices (also the number of guard rows)
  std::vector<uint64_t> state_offsets;
  std::vector<uint64_t> state_item_bytes;
  uint64_t state_rows = 0;
  uint64_t guard_offset = 0;             // guard row r at guard_offset + r * kAuxSlotBytes

  uint64_t kv(size_t buffer, uint64_t page) const { return kv_offsets[buffer] + page * page_bytes; }
  uint64_t aux(size_t buffer, uint64_t row) const { return aux_offsets[buffer] + row * aux_item_bytes[buffer]; }
  uint64_t state(size_t buffer, uint64_t row) const {
    return state_offsets[buffer] + row * state_item_bytes[buffer];
  }
  uint64_t guard(uint64_t row) const { return guard_offset + row * kAuxSlotBytes; }
};

// One registered span of the offset space (the transport's MemorySpan, kvferry/transport.h).
struct MapSpan {
  uint8_t* base = nullptr;  // null for the fast path's span until bind_region()
  uint64_t bytes = 0;
  uint64_t offset = 0;
  MemoryKind memory = MemoryKind::kHost;
};

class MemoryMap {
 public:
  MemoryMap() = default;
  MemoryMap(MemoryMap&&) = default;
  MemoryMap& operator=(MemoryMap&&) = default;

  // The contiguous pool of `layout`: one span at offset 0, at `external` (caller-owned, at least
  // layout.total_bytes()) or, when null, allocated by the transport (base set by bind_region()).
  static MemoryMap contiguous(const PoolLayout& layout, uint8_t* external = nullptr);
  // The engine's buffers plus `guard_rows` guard rows (at least one; one per aux index, so with
  // aux buffers it must equal set.aux_rows). `guard_memory` (may be null: allocated here, zeroed)
  // holds guard_rows * kAuxSlotBytes bytes the caller owns and keeps valid.
  // Errors: kInvalidArgument (zero guard rows, guard rows != aux rows, a size that overflows,
  // guard memory overlapping a buffer).
  static Result<MemoryMap> from_buffers(const BufferSet& set, uint32_t page_size, uint64_t guard_rows,
                                        uint8_t* guard_memory = nullptr);

  // The fast path's span is allocated by the transport: called once with its base.
  bool transport_allocates() const { return transport_allocates_; }
  void bind_region(uint8_t* base);

  const MemoryShape& shape() const { return shape_; }
  const std::vector<MapSpan>& spans() const { return spans_; }
  // The pointer for [offset, offset + bytes) if it lies inside one span, else nullptr.
  uint8_t* pointer(uint64_t offset, uint64_t bytes) const;
  uint8_t* guard_row(uint64_t row) const { return pointer(shape_.guard(row), kAuxSlotBytes); }

 private:
  MemoryShape shape_;
  std::vector<MapSpan> spans_;
  bool transport_allocates_ = false;
  std::unique_ptr<uint8_t[]> own_guard_;
};

// Checks that a shape (a peer's, from its registration) lies inside `spans` given as
// (offset, bytes) pairs: every KV buffer's num_pages pages, every aux and state buffer's rows and
// the guard rows inside one span each, overflow-safe, and that the spans do not overlap. Returns ""
// when it does, else the reason.
struct SpanExtent {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
std::string check_shape_in_spans(const MemoryShape& shape, const std::vector<SpanExtent>& spans);

}  // namespace kvferry
