// SglangRegistry (bootstrap/sglang_routes.h): SGLang's bootstrap routes over bounded, checked maps.
#include "bootstrap/sglang_routes.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <optional>

#include "bootstrap/rank_info_json.h"
#include "kvferry/net.h"

namespace kvferry::bootstrap {
namespace {

constexpr size_t kMaxString = 256;

Reply ok_text() { return {200, "OK", "text/plain"}; }
Reply error(int status, const std::string& message) { return {status, error_body(message), "application/json"}; }
Reply json_reply(const nlohmann::json& j) { return {200, dump(j), "application/json"}; }

// A non-negative integer member below `limit` (JSON number, or a decimal string as SGLang's
// clients sometimes send); nullopt with `err` set otherwise.
std::optional<uint64_t> uint_field(const nlohmann::json& j, const char* name, uint64_t limit, std::string* err,
                                   bool required = true) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    if (required) *err = std::string("field '") + name + "': missing";
    return std::nullopt;
  }
  uint64_t v = 0;
  if (it->is_number_unsigned()) {
    v = it->get<uint64_t>();
  } else if (it->is_number_integer() && it->get<int64_t>() >= 0) {
    v = static_cast<uint64_t>(it->get<int64_t>());
  } else if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
      *err = std::string("field '") + name + "': expected a non-negative integer";
      return std::nullopt;
    }
  } else {
    *err = std::string("field '") + name + "': expected a non-negative integer";
    return std::nullopt;
  }
  if (v >= limit) {
    *err = std::string("field '") + name + "': " + std::to_string(v) + " is out of range (limit " +
           std::to_string(limit) + ")";
    return std::nullopt;
  }
  return v;
}

std::optional<std::string> string_field(const nlohmann::json& j, const char* name, std::string* err,
                                        bool required = true) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    if (required) *err = std::string("field '") + name + "': missing";
    return std::nullopt;
  }
  if (!it->is_string() || it->get_ref<const std::string&>().size() > kMaxString) {
    *err = std::string("field '") + name + "': expected a string of at most " + std::to_string(kMaxString) + " bytes";
    return std::nullopt;
  }
  return it->get<std::string>();
}

// A query value: a decimal integer >= -1 that fits in 32 bits.
std::optional<int64_t> query_int(const std::string* v) {
  if (v == nullptr || v->empty() || v->size() > 12) return std::nullopt;
  int64_t x = 0;
  auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
  if (ec != std::errc() || end != v->data() + v->size() || x < -1 || x > UINT32_MAX) return std::nullopt;
  return x;
}

}  // namespace

Reply SglangRegistry::put_route(const nlohmann::json& j) {
  if (!j.is_object()) return error(400, "body: expected a JSON object");
  std::string err;
  auto size = [&](const char* n) { return uint_field(j, n, kMaxSglangGroup + 1, &err); };
  auto tp_size = size("attn_tp_size"), cp_size = size("attn_cp_size"), dp_size = size("attn_dp_size"),
       pp_size = size("pp_size"), sys_dp_size = size("system_dp_size");
  if (!err.empty()) return error(400, err);
  for (auto [n, v] : {std::pair{"attn_tp_size", *tp_size}, {"attn_cp_size", *cp_size}, {"attn_dp_size", *dp_size},
                      {"pp_size", *pp_size}, {"system_dp_size", *sys_dp_size}})
    if (v == 0) return error(400, std::string("field '") + n + "': must be at least 1");
  auto tp = uint_field(j, "attn_tp_rank", *tp_size, &err);
  auto cp = err.empty() ? uint_field(j, "attn_cp_rank", *cp_size, &err) : std::nullopt;
  auto dp = err.empty() ? uint_field(j, "attn_dp_rank", *dp_size, &err) : std::nullopt;
  auto pp = err.empty() ? uint_field(j, "pp_rank", *pp_size, &err) : std::nullopt;
  auto sys_dp = err.empty() ? uint_field(j, "system_dp_rank", *sys_dp_size, &err) : std::nullopt;
  auto port = err.empty() ? uint_field(j, "rank_port", 65536, &err) : std::nullopt;
  auto page = err.empty() ? uint_field(j, "page_size", 1u << 20, &err) : std::nullopt;
  auto ip = err.empty() ? string_field(j, "rank_ip", &err) : std::nullopt;
  auto dtype = err.empty() ? string_field(j, "kv_cache_dtype", &err) : std::nullopt;
  auto lb = err.empty() ? string_field(j, "load_balance_method", &err, false) : std::nullopt;
  auto http_port = err.empty() ? uint_field(j, "prefill_http_port", 65536, &err, false) : std::nullopt;
  if (!err.empty()) return error(400, err);
  if (*port == 0) return error(400, "field 'rank_port': must be 1..65535");
  if (auto h = parse_host(*ip, /*allow_wildcard=*/false); !h.ok())
    return error(400, "field 'rank_ip': " + h.status().message());
  bool dsa = false;
  if (auto it = j.find("enable_dsa_cache_layer_split"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return error(400, "field 'enable_dsa_cache_layer_split': expected a boolean");
    dsa = it->get<bool>();
  }
  // SGLang's grouping: with one system DP group the attention DP rank names the group.
  const uint32_t groups = static_cast<uint32_t>(*sys_dp_size == 1 ? *dp_size : *sys_dp_size);
  const uint32_t group = static_cast<uint32_t>(*sys_dp_size == 1 ? *dp : *sys_dp);
  const uint64_t total = uint64_t(groups) * *cp_size * *tp_size * *pp_size;
  if (total > kMaxSglangRanks)
    return error(400, "parallel sizes: " + std::to_string(total) + " ranks exceed the bound of " +
                          std::to_string(kMaxSglangRanks));

  Parallel p;
  p.attn_tp_size = static_cast<uint32_t>(*tp_size);
  p.attn_cp_size = static_cast<uint32_t>(*cp_size);
  p.dp_size = groups;
  p.pp_size = static_cast<uint32_t>(*pp_size);
  p.page_size = static_cast<uint32_t>(*page);
  p.kv_cache_dtype = *dtype;
  p.follow_bootstrap_room = !lb || *lb == "follow_bootstrap_room";
  p.enable_dsa_cache_layer_split = dsa;
  p.prefill_http_port = http_port ? static_cast<int64_t>(*http_port) : -1;

  std::lock_guard lock(mu_);
  if (!have_parallel_) {
    parallel_ = p;
    have_parallel_ = true;
  } else if (p.attn_tp_size != parallel_.attn_tp_size || p.attn_cp_size != parallel_.attn_cp_size ||
             p.dp_size != parallel_.dp_size || p.pp_size != parallel_.pp_size || p.page_size != parallel_.page_size ||
             p.kv_cache_dtype != parallel_.kv_cache_dtype) {
    return error(400, "registration disagrees with the instance's first one (tp/cp/dp/pp sizes, page_size, "
                      "kv_cache_dtype): one bootstrap service serves one prefill instance");
  }
  ranks_[Key{group, static_cast<uint32_t>(*cp), static_cast<uint32_t>(*tp), static_cast<uint32_t>(*pp)}] =
      RankAddr{*ip, static_cast<uint32_t>(*port)};
  return ok_text();
}

Reply SglangRegistry::get_route(const std::string* dp, const std::string* cp, const std::string* tp,
                                const std::string* pp) {
  if (!dp || !cp || !tp || !pp || dp->empty() || cp->empty() || tp->empty() || pp->empty())
    return {400, "Missing inputs for bootstrap server.", "text/plain"};
  auto d = query_int(dp), c = query_int(cp), t = query_int(tp), p = query_int(pp);
  if (!d || !c || !t || !p)
    return error(400, "query: prefill_dp_rank, prefill_cp_rank, target_tp_rank and target_pp_rank must be "
                      "integers >= -1");
  std::lock_guard lock(mu_);
  const size_t expected = have_parallel_ ? size_t(parallel_.dp_size) * parallel_.attn_cp_size *
                                               parallel_.attn_tp_size * parallel_.pp_size
                                         : 0;
  if (!have_parallel_ || ranks_.size() < expected)
    return {503, "Prefill server not fully registered yet (" + std::to_string(ranks_.size()) + " workers registered).",
            "text/plain"};
  if (*d == -1 && *c == -1 && *t == -1 && *p == -1) {
    nlohmann::json j = {{"attn_tp_size", parallel_.attn_tp_size},
                        {"attn_cp_size", parallel_.attn_cp_size},
                        {"dp_size", parallel_.dp_size},
                        {"pp_size", parallel_.pp_size},
                        {"page_size", parallel_.page_size},
                        {"kv_cache_dtype", parallel_.kv_cache_dtype},
                        {"follow_bootstrap_room", parallel_.follow_bootstrap_room},
                        {"enable_dsa_cache_layer_split", parallel_.enable_dsa_cache_layer_split},
                        {"prefill_http_port", nullptr}};
    if (parallel_.prefill_http_port >= 0) j["prefill_http_port"] = parallel_.prefill_http_port;
    return json_reply(j);
  }
  if (*d < 0 || *c < 0 || *t < 0 || *p < 0)
    return error(400, "query: -1 asks for the parallel info and must be given for all four parameters");
  auto it = ranks_.find(Key{uint32_t(*d), uint32_t(*c), uint32_t(*t), uint32_t(*p)});
  if (it == ranks_.end())
    return {404, "Bootstrap info not found for dp_rank=" + *dp + " cp_rank=" + *cp + " tp_rank=" + *tp +
                     " pp_rank=" + *pp, "text/plain"};
  return json_reply({{"rank_ip", it->second.ip}, {"rank_port", it->second.port}});
}

void SglangRegistry::expire(int64_t now_ns) {
  while (!room_order_.empty() &&
         (room_order_.front().second + kSglangRoomTtlNs < now_ns || room_order_.size() > kMaxSglangRooms)) {
    auto [room, ns] = room_order_.front();
    room_order_.pop_front();
    auto it = rooms_.find(room);
    if (it != rooms_.end() && it->second.second == ns) rooms_.erase(it);  // not re-registered since
  }
}

Reply SglangRegistry::register_dp_rank(const nlohmann::json& j, int64_t now_ns) {
  if (!j.is_object()) return error(400, "body: expected a JSON object");
  std::string err;
  auto room = uint_field(j, "bootstrap_room", UINT64_MAX, &err);
  auto dp = err.empty() ? uint_field(j, "dp_rank", kMaxSglangGroup, &err) : std::nullopt;
  if (!err.empty()) return error(400, err);
  std::lock_guard lock(mu_);
  rooms_[*room] = {static_cast<uint32_t>(*dp), now_ns};
  room_order_.push_back({*room, now_ns});
  expire(now_ns);
  return ok_text();
}

Reply SglangRegistry::query_dp_ranks(const nlohmann::json& j, int64_t now_ns) {
  if (!j.is_object()) return error(400, "body: expected a JSON object");
  auto it = j.find("bootstrap_rooms");
  if (it == j.end() || !it->is_array()) return error(400, "field 'bootstrap_rooms': expected an array");
  if (it->size() > kMaxSglangQueryRooms)
    return error(400, "field 'bootstrap_rooms': more than " + std::to_string(kMaxSglangQueryRooms) + " rooms");
  nlohmann::json out = nlohmann::json::object();
  std::lock_guard lock(mu_);
  expire(now_ns);
  for (const auto& r : *it) {
    nlohmann::json one = {{"r", r}};
    std::string err;
    auto room = uint_field(one, "r", UINT64_MAX, &err);
    if (!room) return error(400, "field 'bootstrap_rooms': expected non-negative integers");
    auto f = rooms_.find(*room);
    if (f != rooms_.end()) out[std::to_string(*room)] = f->second.first;
  }
  return json_reply(out);
}

size_t SglangRegistry::registered() const {
  std::lock_guard lock(mu_);
  return ranks_.size();
}

}  // namespace kvferry::bootstrap
