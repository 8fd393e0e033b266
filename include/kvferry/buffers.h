// Engine-shaped memory (docs/manager.md "Buffers"): a rank registers the buffers its engine owns,
// as serving engines describe them to their transfer layer (one address, length and item length
// per buffer, of three kinds):
//   kKv     one per layer tensor (MHA/GQA: every layer's K, then every layer's V; MLA: one latent per
//           layer). Item i of a KV buffer is page i: page_size tokens of this rank's heads. A page
//           index addresses item i of every KV buffer. All KV buffers have the same item_bytes.
//   kAux    per-request metadata rows (first output token, cached-token count, logprobs, hidden
//           states, ...), item_bytes per row (may differ between aux buffers). A room's aux_index
//           names its row in every aux buffer; prefill's row is copied into decode's row of every
//           aux buffer after the last KV write.
//   kState  optional per-request state of hybrid models (Mamba, sliding window), item_bytes per row
//           (may differ between state buffers), addressed by the state indices given with the last
//           chunk: state index j names a row of every state buffer.
// Besides the engine's aux buffers, kvferry keeps its own guard row per aux index (an AuxRecord:
// room id, tokens, pages; kAuxSlotBytes each) in memory it allocates; prefill writes it last and
// decode checks it before Success.
//
// A single contiguous pool with kvferry's own layout (kvferry/geometry.h PoolLayout, what
// `kvferry replay` uses) is one way to produce such a list: contiguous_pool_buffers(). Its aux slots
// are kvferry's guard rows, not an engine aux buffer.
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

// Where a buffer's memory lives (docs/gpu.md). A kCuda buffer is device memory of CUDA device
// `BufferDesc::device`; registration refuses it, naming the buffer, on a kvferry built without CUDA
// (KVFERRY_CUDA=OFF), on a machine where no CUDA device is usable, for an ordinal the machine does
// not have, and for an address that is not device memory of that device. Past those checks, moving
// it still needs a UCX build with CUDA support (ucx_info -d lists cuda_copy/cuda_ipc); without it
// the transport refuses it with a message naming the missing support, never copying through the host.
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };
std::string_view memory_kind_name(MemoryKind k);  // "host", "cuda"

struct BufferDesc {
  uint64_t address = 0;     // start of the buffer (must stay valid until the manager is closed)
  uint64_t bytes = 0;       // size of the buffer
  uint64_t item_bytes = 0;  // bytes of one page (kKv) or one row (kAux, kState)
  BufferKind kind = BufferKind::kKv;
  MemoryKind memory = MemoryKind::kHost;
  // kCuda: the CUDA device ordinal the memory belongs to (SGLang's gpu_id; cudaSetDevice's
  // numbering in this process). kHost: 0. A rank may mix host and device buffers.
  int32_t device = 0;
};

// Bound on a device ordinal (checked before any CUDA call sees it).
constexpr int32_t kMaxCudaDevices = 64;

// Bounds on a buffer list (also the bounds of a peer's registration, kvferry/messages.h).
constexpr uint32_t kMaxKvBuffers = 4096;     // e.g. 2 x 128 layers with room to spare
constexpr uint32_t kMaxAuxBuffers = 64;
constexpr uint32_t kMaxStateBuffers = 256;

// The checked shape of a buffer list, each kind in the order given. Errors of check_buffers:
// kInvalidArgument naming the buffer (by kind and index among its kind): null address, zero bytes
// or item_bytes, bytes < item_bytes, an address range that wraps, KV buffers of different
// item_bytes, no KV buffer, more buffers of a kind than its bound, overlapping buffers.
struct BufferSet {
  std::vector<BufferDesc> kv;
  std::vector<BufferDesc> aux;
  std::vector<BufferDesc> state;
  uint64_t num_pages = 0;       // min over KV buffers of bytes / item_bytes
  uint64_t page_bytes = 0;      // item_bytes of every KV buffer
  uint64_t aux_rows = 0;        // min over aux buffers of bytes / item_bytes (0: no aux buffer)
  uint64_t state_rows = 0;      // min over state buffers of bytes / item_bytes (0: none)

  std::vector<uint64_t> aux_item_bytes() const;    // item_bytes of each aux buffer, in order
  std::vector<uint64_t> state_item_bytes() const;  // item_bytes of each state buffer, in order
};
Result<BufferSet> check_buffers(const std::vector<BufferDesc>& buffers);

// The KV buffer list of a contiguous pool at `base` laid out as `layout`: buffer b is
// [base + layout.page_offset(b, 0), + layout.buffer_bytes()), item_bytes layout.page_bytes(). The
// layout's aux slots (after the KV buffers) are kvferry's guard rows, so they are not listed.
std::vector<BufferDesc> contiguous_pool_buffers(uint8_t* base, const PoolLayout& layout);

}  // namespace kvferry
