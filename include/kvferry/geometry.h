// Model KV geometry and the per-rank KV pool layout.
//
// Geometry comes from data/models.json (vendored from kvferry's shared kv_geometry.json, each
// entry naming its public source). Layout of one rank's pool, a single registered region:
//
//   [buffer 0][buffer 1]...[buffer B-1][aux slot 0]...[aux slot A-1]
//   buffer b = layer (b % num_layers), tensor (b / num_layers: 0 = K, 1 = V; MLA has one latent
//   tensor), the order of an engine's buffer list (kvferry/buffers.h: every layer's K, then every
//   layer's V); each buffer = num_pages pages, page = page_size tokens,
//   token = heads_per_rank x head_dim x dtype_bytes bytes (this rank's head slice).
//
// Units: bytes unless named otherwise; page_size in tokens.
// Thread contract: value types.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvferry/error.h"

namespace kvferry {

struct ModelGeometry {
  std::string name;             // "Llama-3.1-8B"
  std::string attention;        // "GQA", "MHA" or "MLA"
  uint32_t num_layers = 0;      // num_hidden_layers
  uint32_t tensors_per_layer = 0;  // 2 (K, V) or 1 (MLA latent)
  uint32_t cache_heads = 0;     // KV heads per layer (1 for MLA)
  uint32_t head_dim = 0;        // cache entry width in elements (576 for DeepSeek-V3 MLA)
  uint32_t dtype_bytes = 0;     // 2 for bfloat16
  uint64_t kv_bytes_per_token() const {
    return uint64_t(num_layers) * tensors_per_layer * cache_heads * head_dim * dtype_bytes;
  }
  bool is_mla() const { return attention == "MLA"; }
};

// Parses the vendored models.json text (an array of objects with the keys of kv_geometry.json).
Result<std::vector<ModelGeometry>> parse_models_json(const std::string& text);
// Finds `name` in `models`; the error lists every known name.
Result<ModelGeometry> find_model(const std::vector<ModelGeometry>& models, const std::string& name);
// Reads the models file at `path` and finds `name` in it. Errors: kInvalidArgument when the file
// cannot be read or parsed (the message names the file) or the model is unknown (lists the names).
Result<ModelGeometry> load_model_file(const std::string& path, const std::string& name);

// A range of the model's layers [begin, end), 0-based (layer-wise sends, kvferry/manager.h).
// Layer l is KV buffers l + t * num_layers for every tensor t < tensors_per_layer (its K and V;
// MLA: buffer l alone), in an engine's buffer list and in kvferry's pool alike. The default is
// every layer.
struct LayerRange {
  static constexpr uint32_t kToLastLayer = 0xFFFFFFFFu;
  uint32_t begin = 0;
  uint32_t end = kToLastLayer;  // exclusive; kToLastLayer: up to and including the model's last layer
  bool operator==(const LayerRange&) const = default;
};
// `r` with kToLastLayer resolved against `num_layers`. Errors (kInvalidArgument, naming the
// values): an empty range (begin >= end) or one past the model's last layer.
Result<LayerRange> resolve_layers(LayerRange r, uint32_t num_layers);

// Bytes of one aux slot (an AuxRecord padded to a cache line).
constexpr uint64_t kAuxSlotBytes = 64;

// What decode writes into its aux slot guard and what prefill writes last (docs/design.md §2 step 5).
struct AuxRecord {
  uint64_t room = 0;            // guard: must equal the room the slot was given to
  uint64_t first_token_id = 0;  // simulated first output token
  uint64_t cached_tokens = 0;   // tokens of KV written (the request's input length)
  uint64_t num_pages = 0;       // pages written per buffer
};
static_assert(sizeof(AuxRecord) <= kAuxSlotBytes);

struct PoolLayout {
  ModelGeometry model;
  uint32_t tp_size = 1;
  uint32_t tp_rank = 0;
  uint32_t page_size = 1;       // tokens per page
  uint32_t heads_per_rank = 0;  // cache heads held by this rank (MLA: 1, replicated)
  uint32_t first_head = 0;      // global index of this rank's first head
  uint64_t num_pages = 0;       // pages per buffer
  uint32_t aux_slots = 0;

  uint32_t num_buffers() const { return model.num_layers * model.tensors_per_layer; }
  uint64_t token_bytes() const { return uint64_t(heads_per_rank) * model.head_dim * model.dtype_bytes; }
  uint64_t page_bytes() const { return token_bytes() * page_size; }
  uint64_t buffer_bytes() const { return page_bytes() * num_pages; }
  uint64_t page_offset(uint32_t buffer, uint64_t page) const {
    return buffer * buffer_bytes() + page * page_bytes();
  }
  uint64_t aux_offset(uint32_t slot) const {
    return num_buffers() * buffer_bytes() + uint64_t(slot) * kAuxSlotBytes;
  }
  uint64_t total_bytes() const { return aux_offset(aux_slots); }
  // Pages needed per buffer for `tokens` tokens.
  uint64_t pages_for(uint64_t tokens) const { return (tokens + page_size - 1) / page_size; }
  // Bytes of KV this rank holds for `pages` pages (over all buffers).
  uint64_t bytes_for_pages(uint64_t pages) const { return pages * page_bytes() * num_buffers(); }
};

// The cache heads rank `tp_rank` of `tp_size` holds: [first, first + count) in global head
// numbering. GQA/MHA: split evenly when tp_size divides the heads; with more ranks than heads (a
// multiple), each rank holds one head, replicated on tp_size / heads ranks (as serving engines
// replicate KV heads). MLA: every rank holds the single latent (first 0, count 1).
struct HeadSlice {
  uint32_t first = 0;
  uint32_t count = 0;
};
Result<HeadSlice> head_slice(const ModelGeometry& m, uint32_t tp_size, uint32_t tp_rank);

// Builds the layout of rank `tp_rank` of `tp_size` with as many pages as fit in `pool_bytes`
// (aux slots included). Heads are split evenly; with fewer KV heads than ranks a head is
// replicated (rank r holds head r * heads / tp_size). MLA: every rank holds the one latent.
// Errors: kInvalidArgument when the pool cannot hold a single page or tp_size does not divide.
Result<PoolLayout> make_layout(const ModelGeometry& m, uint32_t tp_size, uint32_t tp_rank,
                               uint32_t page_size, uint64_t pool_bytes, uint32_t aux_slots);

}  // namespace kvferry
