// End-to-end integrity of a room's bytes (ManagerConfig::integrity; docs/failure-model.md
// "Integrity"): a digest of what a prefill rank writes to one decode rank for a room, computed by
// the prefill rank over its source bytes before they are written and by the decode rank over what
// landed, from its own plan (never from the peer's claim).
//
// Definition. The bytes a source writes to a destination for a room are cut into *pieces*: per KV
// buffer, per room page, per token row, the slice of the row this source's heads occupy (one head
// transfer of the plan, topology.h; with every head of the row, the whole row), and, for the
// destination's lowest source only (it writes the room's final batch), each aux row, each state row
// and the guard row. A piece's digest is XXH3-64 of its bytes seeded with its destination offset
// (in the decode rank's offset space), and the room's digest for that source is the sum of its
// pieces' digests mod 2^64. The sum does not depend on the order the pieces are written in or on
// how they are grouped into chunks, layer ranges or coalesced writes; the seed makes a piece that
// landed at the wrong place (or two swapped pieces) count as a mismatch.
// Thread contract: pure functions over memory the caller keeps valid and unchanged meanwhile.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "endpoint/memory_map.h"
#include "endpoint/topology.h"
#include "kvferry/geometry.h"
#include "kvferry/transport.h"

namespace kvferry {

// One piece: XXH3-64 of [p, p + bytes) seeded with `dest_offset`.
uint64_t piece_digest(const uint8_t* p, uint64_t bytes, uint64_t dest_offset);

// Prefill: the digest of `ops` as written (local bytes of `map`, destination offsets), each op
// cut into pieces of `piece_bytes` (0 or more than the op: the op is one piece). An op outside
// `map` adds a fixed value (it cannot be read here; such an op is refused before it is written).
uint64_t ops_digest(const MemoryMap& map, std::span<const WriteOp> ops, uint64_t piece_bytes);

// What decode expects of one source of a room: which of this rank's regions it writes.
struct SourceRegions {
  uint32_t source_tp = 0;                  // the prefill rank's tp_rank
  std::span<const uint64_t> kv_indices;    // the room's pages here, in token order
  bool final_rows = false;                 // it is this rank's lowest source: aux, state, guard rows
  uint64_t aux_index = 0;
  std::span<const uint64_t> state_indices;
};

// Decode: the digest of what `src` should have written here, computed over what is in `map` now.
// `layout`: this rank's (heads, page size, model); `plan`: the engines' head transfers.
uint64_t landed_digest(const MemoryMap& map, const PoolLayout& layout, const std::vector<HeadTransfer>& plan,
                       uint32_t self_tp, const SourceRegions& src);

}  // namespace kvferry
