// Model geometry (models.json parsing, lookup) and the per-rank pool layout.
#include "kvferry/geometry.h"

#include <fstream>
#include <limits>
#include <sstream>
#include <nlohmann/json.hpp>

namespace kvferry {
namespace {

using nlohmann::json;

// Reads a positive integer field that fits uint32_t; `what` names the entry for errors.
Status read_u32(const json& obj, const char* key, const std::string& what, uint32_t* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return {ErrorCode::kInvalidArgument, what + ": missing field '" + key + "'"};
  if (!it->is_number_integer()) {
    return {ErrorCode::kInvalidArgument, what + ": field '" + key + "' must be an integer"};
  }
  const int64_t v = it->get<int64_t>();
  if (v <= 0 || v > std::numeric_limits<uint32_t>::max()) {
    return {ErrorCode::kInvalidArgument,
            what + ": field '" + key + "' must be a positive 32-bit integer, got " + std::to_string(v)};
  }
  *out = static_cast<uint32_t>(v);
  return {};
}

Result<ModelGeometry> parse_entry(const json& e, size_t index) {
  std::string what = "models.json entry " + std::to_string(index);
  if (!e.is_object()) return Status(ErrorCode::kInvalidArgument, what + ": not an object");
  auto name = e.find("model");
  if (name == e.end() || !name->is_string() || name->get<std::string>().empty()) {
    return Status(ErrorCode::kInvalidArgument, what + ": 'model' must be a non-empty string");
  }
  ModelGeometry m;
  m.name = name->get<std::string>();
  what += " (" + m.name + ")";
  auto att = e.find("attention");
  if (att == e.end() || !att->is_string()) {
    return Status(ErrorCode::kInvalidArgument, what + ": 'attention' must be a string");
  }
  m.attention = att->get<std::string>();
  if (m.attention != "GQA" && m.attention != "MHA" && m.attention != "MLA") {
    return Status(ErrorCode::kInvalidArgument,
                  what + ": 'attention' must be GQA, MHA or MLA, got '" + m.attention + "'");
  }
  for (auto [key, out] : {std::pair{"num_hidden_layers", &m.num_layers},
                          std::pair{"cache_tensors_per_layer", &m.tensors_per_layer},
                          std::pair{"cache_heads_per_layer", &m.cache_heads},
                          std::pair{"cache_entry_dim", &m.head_dim},
                          std::pair{"dtype_bytes", &m.dtype_bytes}}) {
    Status s = read_u32(e, key, what, out);
    if (!s.ok()) return s;
  }
  if (m.is_mla() && (m.tensors_per_layer != 1 || m.cache_heads != 1)) {
    return Status(ErrorCode::kInvalidArgument,
                  what + ": MLA caches one latent: cache_tensors_per_layer and cache_heads_per_layer must be 1");
  }
  if (!m.is_mla() && m.tensors_per_layer != 2) {
    return Status(ErrorCode::kInvalidArgument, what + ": GQA/MHA caches K and V: cache_tensors_per_layer must be 2");
  }
  // The file states its own total; a disagreement means the entry is inconsistent.
  auto total = e.find("kv_bytes_per_token");
  if (total != e.end()) {
    if (!total->is_number_integer()) {
      return Status(ErrorCode::kInvalidArgument, what + ": field 'kv_bytes_per_token' must be an integer");
    }
    if (total->get<int64_t>() != static_cast<int64_t>(m.kv_bytes_per_token())) {
      return Status(ErrorCode::kInvalidArgument,
                    what + ": kv_bytes_per_token " + std::to_string(total->get<int64_t>()) +
                        " disagrees with the geometry (" + std::to_string(m.kv_bytes_per_token()) + ")");
    }
  }
  return m;
}

}  // namespace

Result<std::vector<ModelGeometry>> parse_models_json(const std::string& text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status(ErrorCode::kInvalidArgument, "models.json: not valid JSON");
  if (!doc.is_array()) return Status(ErrorCode::kInvalidArgument, "models.json: top level must be an array");
  std::vector<ModelGeometry> models;
  models.reserve(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    auto m = parse_entry(doc[i], i);
    if (!m.ok()) return m.status();
    for (const auto& prev : models) {
      if (prev.name == m->name) {
        return Status(ErrorCode::kInvalidArgument, "models.json: duplicate model '" + m->name + "'");
      }
    }
    models.push_back(std::move(*m));
  }
  return models;
}

Result<ModelGeometry> find_model(const std::vector<ModelGeometry>& models, const std::string& name) {
  std::string known;
  for (const auto& m : models) {
    if (m.name == name) return m;
    if (!known.empty()) known += ", ";
    known += m.name;
  }
  return Status(ErrorCode::kInvalidArgument, "unknown model '" + name + "'; known models: " + known);
}

Result<HeadSlice> head_slice(const ModelGeometry& m, uint32_t tp_size, uint32_t tp_rank) {
  if (tp_size == 0 || tp_rank >= tp_size)
    return Status(ErrorCode::kInvalidArgument,
                  "tp_rank " + std::to_string(tp_rank) + " is not a rank of tp_size " + std::to_string(tp_size));
  if (m.is_mla()) return HeadSlice{0, 1};
  if (m.cache_heads % tp_size == 0) return HeadSlice{tp_rank * (m.cache_heads / tp_size), m.cache_heads / tp_size};
  if (tp_size > m.cache_heads && tp_size % m.cache_heads == 0)
    return HeadSlice{static_cast<uint32_t>(uint64_t(tp_rank) * m.cache_heads / tp_size), 1};
  return Status(ErrorCode::kInvalidArgument,
                "tp_size " + std::to_string(tp_size) + " does not divide (and is not a multiple of) the " +
                    std::to_string(m.cache_heads) + " KV heads of " + m.name);
}

Result<PoolLayout> make_layout(const ModelGeometry& m, uint32_t tp_size, uint32_t tp_rank,
                               uint32_t page_size, uint64_t pool_bytes, uint32_t aux_slots) {
  if (tp_size == 0 || tp_rank >= tp_size) {
    return Status(ErrorCode::kInvalidArgument, "tp_rank " + std::to_string(tp_rank) +
                                                   " is not a rank of tp_size " + std::to_string(tp_size));
  }
  if (page_size == 0) return Status(ErrorCode::kInvalidArgument, "page_size must be > 0");
  if (m.num_layers == 0 || m.tensors_per_layer == 0 || m.cache_heads == 0 || m.head_dim == 0 ||
      m.dtype_bytes == 0) {
    return Status(ErrorCode::kInvalidArgument, "model '" + m.name + "' has an empty geometry");
  }
  PoolLayout l;
  l.model = m;
  l.tp_size = tp_size;
  l.tp_rank = tp_rank;
  l.page_size = page_size;
  l.aux_slots = aux_slots;
  auto slice = head_slice(m, tp_size, tp_rank);
  if (!slice.ok()) return slice.status();
  l.heads_per_rank = slice->count;
  l.first_head = slice->first;
  const uint64_t aux_bytes = uint64_t(aux_slots) * kAuxSlotBytes;
  const uint64_t stripe = uint64_t(l.num_buffers()) * l.page_bytes();  // one page in every buffer
  if (pool_bytes <= aux_bytes || (pool_bytes - aux_bytes) / stripe == 0) {
    return Status(ErrorCode::kInvalidArgument,
                  "pool of " + std::to_string(pool_bytes) + " bytes cannot hold one page per buffer (" +
                      std::to_string(stripe) + " bytes) plus " + std::to_string(aux_slots) + " aux slots");
  }
  l.num_pages = (pool_bytes - aux_bytes) / stripe;
  return l;
}

Result<ModelGeometry> load_model_file(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kInvalidArgument, "cannot read the models file " + path);
  std::stringstream text;
  text << in.rdbuf();
  auto models = parse_models_json(text.str());
  if (!models.ok()) {
    return Status(ErrorCode::kInvalidArgument, "models file " + path + ": " + models.status().message());
  }
  return find_model(*models, name);
}

}  // namespace kvferry

namespace kvferry {

Result<LayerRange> resolve_layers(LayerRange r, uint32_t num_layers) {
  if (r.end == LayerRange::kToLastLayer) r.end = num_layers;
  if (r.begin >= r.end)
    return Status(ErrorCode::kInvalidArgument, "layer range [" + std::to_string(r.begin) + ", " +
                                                   std::to_string(r.end) + ") is empty");
  if (r.end > num_layers)
    return Status(ErrorCode::kInvalidArgument, "layer range [" + std::to_string(r.begin) + ", " +
                                                   std::to_string(r.end) + ") is past the model's " +
                                                   std::to_string(num_layers) + " layers");
  return r;
}

}  // namespace kvferry
