// Engine-shaped memory (docs/manager.md "Buffers"): a rank registers the buffers its engine owns,
// as serving engines describe them to their transfer layer (SGLang's KVArgs kv/aux/state
// data_ptrs, data_lens, item_lens):
//   kKv     one per layer tensor (MHA/GQA: every layer's K, then every layer's V; MLA: one latent per
//           layer). Item i of a KV buffer is page i: page_size tokens of this rank's heads. A page
//           index addresses item i of every KV buffer. All KV buffers have the same item_bytes.
//   kAux    per-request metadata rows (first output token, cached-token count, logprobs, hidden
//           states, ...), item_bytes per row. A room's aux_index names its row in every aux buffer;
//           prefill's row is copied into decode's row of every aux buffer after the last KV write.
//   kState  optional per-request state of hybrid models (Mamba, sliding window), item_bytes per row,
//           addressed by the state indices given with the last chunk (one index per state buffer
//           row set; see Sender::send).
// Besides the engine's aux buffers, kvferry keeps its own guard row per aux index (the room id and
// counts, 64 bytes) in memory it allocates; decode checks it before Success.
//
// A single contiguous pool with kvferry's own layout (kvferry/geometry.h PoolLayout, what
// `kvferry replay` uses) is one way to produce such a list: contiguous_pool_buffers().
//
// Units: bytes; addresses are the engine's virtual addresses (host) or device pointers.
// Thread contract: value types and pure functions.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvferry/error.h"
#include "kvferry/geometry.h"

namespace kvferry {

enum class BufferKind : uint8_t { kKv = 0, kAux = 1, kState = 2 };
std::string_view buffer_kind_name(BufferKind k);  // "kv", "aux", "state"

// Where a buffer's memory lives. kCuda needs a UCX build with CUDA support (ucx_info -d lists
// cuda_copy/cuda_ipc); without it a kCuda buffer is refused at registration with a message naming
// the missing support, never copied through the host.
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };
std::string_view memory_kind_name(MemoryKind k);  // "host", "cuda"

struct BufferDesc {
  uint64_t address = 0;     // start of the buffer (must stay valid until the manager is closed)
  uint64_t bytes = 0;       // size of the buffer
  uint64_t item_bytes = 0;  // bytes of one page (kKv) or one row (kAux, kState)
  BufferKind kind = BufferKind::kKv;
  MemoryKind memory = MemoryKind::kHost;
};

// The checked shape of a buffer list. Errors of check_buffers: kInvalidArgument naming the buffer
// (null address, zero bytes or item_bytes, bytes < item_bytes, KV buffers of different item_bytes,
// no KV buffer, a count that overflows, overlapping buffers).
struct BufferSet {
  std::vector<BufferDesc> kv;
  std::vector<BufferDesc> aux;
  std::vector<BufferDesc> state;
  uint64_t num_pages = 0;       // min over KV buffers of bytes / item_bytes
  uint64_t page_bytes = 0;      // item_bytes of every KV buffer
  uint64_t aux_rows = 0;        // min over aux buffers of bytes / item_bytes (0: no aux buffer)
  uint64_t state_rows = 0;      // min over state buffers of bytes / item_bytes (0: none)
};
Result<BufferSet> check_buffers(const std::vector<BufferDesc>& buffers);

// The buffer list of a contiguous pool at `base` laid out as `layout` (KV buffers only; the aux
// slots of the layout become one aux buffer of kAuxSlotBytes rows).
std::vector<BufferDesc> contiguous_pool_buffers(uint8_t* base, const PoolLayout& layout);

}  // namespace kvferry
