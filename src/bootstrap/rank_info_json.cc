#include "bootstrap/rank_info_json.h"

#include <sodium.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "kvferry/net.h"
#include "kvferry/transport.h"

namespace kvferry::bootstrap {
namespace {

Status field_error(const char* name, const std::string& why) {
  return Status(ErrorCode::kInvalidArgument, "field '" + std::string(name) + "': " + why);
}

Status get_u32(const nlohmann::json& j, const char* name, uint32_t* out) {
  auto it = j.find(name);
  if (it == j.end()) return field_error(name, "missing");
  if (!it->is_number_unsigned() ||
      it->get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
    return field_error(name, "expected an unsigned 32-bit integer");
  }
  *out = static_cast<uint32_t>(it->get<uint64_t>());
  return Status::Ok();
}

Status get_string(const nlohmann::json& j, const char* name, std::string* out) {
  auto it = j.find(name);
  if (it == j.end()) return field_error(name, "missing");
  if (!it->is_string()) return field_error(name, "expected a string");
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > kMaxRankInfoString) {
    return field_error(name, "longer than " + std::to_string(kMaxRankInfoString) + " bytes");
  }
  *out = s;
  return Status::Ok();
}

}  // namespace

namespace {

std::string to_base64(const std::string& bytes) {
  std::string out(sodium_base64_encoded_len(bytes.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                    sodium_base64_VARIANT_ORIGINAL);
  out.resize(std::strlen(out.c_str()));
  return out;
}

// At most kMaxWorkerAddressBytes decoded bytes (a worker address of every shard, checked again by
// the transport before use).
Result<std::string> from_base64(const std::string& text) {
  if (text.size() > (kMaxWorkerAddressBytes / 3 + 1) * 4) return Status(ErrorCode::kInvalidArgument, "too long");
  std::string out(text.size() / 4 * 3 + 3, '\0');
  size_t len = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), text.data(), text.size(), nullptr,
                        &len, nullptr, sodium_base64_VARIANT_ORIGINAL) != 0)
    return Status(ErrorCode::kInvalidArgument, "not standard base64");
  out.resize(len);
  return out;
}

}  // namespace

// "compat": [[name, value], ...] (kvferry/compat.h), in the fingerprint's order.
nlohmann::json compat_to_json(const Compat& c) {
  nlohmann::json a = nlohmann::json::array();
  for (const CompatField& f : c) a.push_back(nlohmann::json::array({f.name, f.value}));
  return a;
}

Status compat_from_json(const nlohmann::json& j, Compat* out) {
  if (!j.is_array() || j.size() > kMaxCompatFields)
    return field_error("compat", "expected an array of at most " + std::to_string(kMaxCompatFields) + " [name, value] pairs");
  for (const nlohmann::json& p : j) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_string() || !p[1].is_string())
      return field_error("compat", "expected [name, value] string pairs");
    out->push_back({p[0].get<std::string>(), p[1].get<std::string>()});
  }
  if (std::string why = compat_bounds_error(*out); !why.empty()) return field_error("compat", why);
  return Status::Ok();
}

nlohmann::json rank_info_to_json(const PrefillRankInfo& info) {
  return nlohmann::json{
      {"compat", compat_to_json(info.compat)},
      {"engine_id", info.engine_id},
      {"dp_rank", info.dp_rank},
      {"tp_rank", info.tp_rank},
      {"tp_size", info.tp_size},
      {"host", info.host},
      {"control_endpoint", info.control_endpoint},
      {"page_size", info.page_size},
      {"dtype", info.dtype},
      {"model", info.model},
      {"num_layers", info.num_layers},
      {"heads_per_rank", info.heads_per_rank},
      {"first_head", info.first_head},
      {"incarnation", info.incarnation},
      {"transport_address", to_base64(info.transport_address)},
  };
}

Result<PrefillRankInfo> rank_info_from_json(const nlohmann::json& j) {
  if (!j.is_object()) {
    return Status(ErrorCode::kInvalidArgument, "rank info: expected a JSON object");
  }
  PrefillRankInfo info;
  // The fingerprint first (kvferry/compat.h): optional, absent is an empty one.
  if (auto it = j.find("compat"); it != j.end()) {
    if (Status s = compat_from_json(*it, &info.compat); !s.ok()) return s;
  }
  for (const Status& s : {
           get_u32(j, "engine_id", &info.engine_id),
           get_u32(j, "dp_rank", &info.dp_rank),
           get_u32(j, "tp_rank", &info.tp_rank),
           get_u32(j, "tp_size", &info.tp_size),
           get_string(j, "host", &info.host),
           get_string(j, "control_endpoint", &info.control_endpoint),
           get_u32(j, "page_size", &info.page_size),
           get_string(j, "dtype", &info.dtype),
           get_string(j, "model", &info.model),
           get_u32(j, "num_layers", &info.num_layers),
           get_u32(j, "heads_per_rank", &info.heads_per_rank),
           get_u32(j, "first_head", &info.first_head),
       }) {
    if (!s.ok()) return s;
  }
  if (auto it = j.find("incarnation"); it != j.end()) {
    if (!it->is_number_unsigned()) return field_error("incarnation", "expected an unsigned 64-bit integer");
    info.incarnation = it->get<uint64_t>();
  }
  if (auto it = j.find("transport_address"); it != j.end()) {
    if (!it->is_string()) return field_error("transport_address", "expected a base64 string");
    auto bytes = from_base64(it->get_ref<const std::string&>());
    if (!bytes.ok()) return field_error("transport_address", bytes.status().message());
    info.transport_address = std::move(bytes).value();
  }
  if (info.tp_size == 0) return field_error("tp_size", "must be at least 1");
  if (info.tp_rank >= info.tp_size) {
    return field_error("tp_rank", std::to_string(info.tp_rank) + " is not below tp_size " +
                                      std::to_string(info.tp_size));
  }
  // Peers connect to these: a usable host, never a wildcard (kvferry/net.h).
  if (auto h = parse_host(info.host, /*allow_wildcard=*/false); !h.ok()) {
    return field_error("host", h.status().message());
  }
  if (info.control_endpoint.rfind("tcp://", 0) != 0) {
    return field_error("control_endpoint", "expected tcp://host:port");
  }
  auto ep = parse_host_port(info.control_endpoint);
  if (!ep.ok()) return field_error("control_endpoint", ep.status().message());
  if (ep->port == 0 || is_wildcard_host(ep->host)) {
    return field_error("control_endpoint", "needs a host peers can reach and a port other than 0");
  }
  return info;
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string error_body(const std::string& message) {
  return dump(nlohmann::json{{"error", message}});
}

}  // namespace kvferry::bootstrap
