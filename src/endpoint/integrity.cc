// Room digests (endpoint/integrity.h).
#include "endpoint/integrity.h"

#include <xxhash.h>

namespace kvferry {
namespace {
// What an unreadable piece adds: the digest cannot match by accident of an empty sum.
constexpr uint64_t kUnreadablePiece = 0x9e3779b97f4a7c15ull;
}  // namespace

uint64_t piece_digest(const uint8_t* p, uint64_t bytes, uint64_t dest_offset) {
  return XXH3_64bits_withSeed(p, static_cast<size_t>(bytes), dest_offset);
}

uint64_t ops_digest(const MemoryMap& map, std::span<const WriteOp> ops, uint64_t piece_bytes) {
  uint64_t sum = 0;
  for (const WriteOp& op : ops) {
    const uint64_t step = piece_bytes == 0 || piece_bytes > op.length ? op.length : piece_bytes;
    if (step == 0) continue;
    const uint8_t* base = map.pointer(op.local_offset, op.length);
    if (base == nullptr) {
      sum += kUnreadablePiece;
      continue;
    }
    for (uint64_t at = 0; at < op.length; at += step) {
      const uint64_t n = op.length - at < step ? op.length - at : step;
      sum += piece_digest(base + at, n, op.remote_offset + at);
    }
  }
  return sum;
}

namespace {
void add_region(const MemoryMap& map, uint64_t offset, uint64_t bytes, uint64_t& sum) {
  if (bytes == 0) return;
  const uint8_t* p = map.pointer(offset, bytes);
  sum += p ? piece_digest(p, bytes, offset) : kUnreadablePiece;
}
}  // namespace

uint64_t landed_digest(const MemoryMap& map, const PoolLayout& layout, const std::vector<HeadTransfer>& plan,
                       uint32_t self_tp, const SourceRegions& src) {
  const MemoryShape& sh = map.shape();
  const uint64_t head_bytes = uint64_t(layout.model.head_dim) * layout.model.dtype_bytes;
  const uint64_t token_bytes = layout.page_size ? sh.page_bytes / layout.page_size : 0;
  uint64_t sum = 0;
  for (const HeadTransfer& t : plan) {
    if (t.prefill_rank != src.source_tp || t.decode_rank != self_tp) continue;
    const uint64_t off = uint64_t(t.first_head - layout.first_head) * head_bytes;
    const uint64_t slice = uint64_t(t.num_heads) * head_bytes;
    for (size_t b = 0; b < sh.kv_offsets.size(); ++b) {
      for (uint64_t p : src.kv_indices) {
        const uint64_t page = sh.kv(b, p);
        const uint8_t* base = map.pointer(page, sh.page_bytes);
        for (uint32_t tok = 0; tok < layout.page_size; ++tok) {
          const uint64_t at = tok * token_bytes + off;
          if (base == nullptr || at + slice > sh.page_bytes) {
            sum += kUnreadablePiece;
            continue;
          }
          sum += piece_digest(base + at, slice, page + at);
        }
      }
    }
  }
  if (src.final_rows) {
    for (size_t a = 0; a < sh.aux_offsets.size(); ++a) add_region(map, sh.aux(a, src.aux_index), sh.aux_item_bytes[a], sum);
    for (size_t s = 0; s < sh.state_offsets.size(); ++s)
      for (uint64_t row : src.state_indices) add_region(map, sh.state(s, row), sh.state_item_bytes[s], sum);
    add_region(map, sh.guard(src.aux_index), sizeof(AuxRecord), sum);
  }
  return sum;
}

}  // namespace kvferry
