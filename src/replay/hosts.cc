// The --hosts file of `kvferry replay` (hosts.h): parse, check, query.
#include "replay/hosts.h"

#include <algorithm>
#include <fstream>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvferry/net.h"

namespace kvferry::replay {
namespace {

using json = nlohmann::ordered_json;

Status invalid(std::string msg) { return {ErrorCode::kInvalidArgument, std::move(msg)}; }

// Host keys and link names: what a fault spec (KIND@HOST) and a shell can carry unquoted.
bool plain_name(std::string_view s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (char ch : s) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                    ch == '_' || ch == '-' || ch == '.';
    if (!ok) return false;
  }
  return true;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || (is_ipv4_literal(host) && host.rfind("127.", 0) == 0);
}

Status unknown_keys(const json& obj, const std::vector<std::string>& known, const std::string& where) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    return invalid(fmt::format("unknown key '{}' in {} (known: {})", key, where, list));
  }
  return Status::Ok();
}

// A JSON array of non-empty strings, at most `max` of them.
Result<std::vector<std::string>> string_list(const json& v, const std::string& where, size_t max) {
  if (!v.is_array()) return invalid(where + " must be an array of strings");
  if (v.size() > max) return invalid(fmt::format("{} has {} entries, at most {}", where, v.size(), max));
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get<std::string>().empty()) {
      return invalid(fmt::format("{}[{}] must be a non-empty string", where, i));
    }
    const std::string s = v[i].get<std::string>();
    if (s.find('\0') != std::string::npos) return invalid(fmt::format("{}[{}] contains a NUL byte", where, i));
    out.push_back(s);
  }
  return out;
}

Result<HostEntry> parse_host_entry(const std::string& key, const json& v) {
  const std::string where = "hosts." + key;
  if (!plain_name(key, 64)) {
    return invalid(fmt::format("host key '{}' must be 1..64 letters, digits, '_', '-' or '.'", key));
  }
  if (!v.is_object()) return invalid(where + " must be an object");
  if (Status st = unknown_keys(v, {"address", "exec", "links"}, where); !st.ok()) return st;
  HostEntry h;
  h.name = key;
  if (!v.contains("address") || !v["address"].is_string()) {
    return invalid(where + ".address is required (a string: the host's IPv4/IPv6 address or name)");
  }
  auto addr = parse_host(v["address"].get<std::string>(), /*allow_wildcard=*/false);
  if (!addr.ok()) return invalid(where + ".address: " + addr.status().message());
  h.address = *addr;
  if (v.contains("exec")) {
    auto exec = string_list(v["exec"], where + ".exec", kMaxExecArgs);
    if (!exec.ok()) return exec.status();
    h.exec = std::move(*exec);
  }
  if (v.contains("links")) {
    auto links = string_list(v["links"], where + ".links", kMaxLinks);
    if (!links.ok()) return links.status();
    for (const auto& l : *links) {
      if (!plain_name(l, 15)) {
        return invalid(fmt::format("{}.links: '{}' is not a link name (1..15 letters, digits, '_', '-', '.')",
                                   where, l));
      }
    }
    h.links = std::move(*links);
  }
  return h;
}

Status check_host_key(const HostsFile& hf, const std::string& key, const std::string& where) {
  if (hf.hosts.count(key)) return Status::Ok();
  std::string list;
  for (const auto& [k, h] : hf.hosts) list += (list.empty() ? "" : ", ") + k;
  return invalid(fmt::format("{} names host '{}', which is not in \"hosts\" (hosts: {})", where, key, list));
}

Result<std::vector<std::string>> parse_rank_hosts(const HostsFile& hf, const json& place, const char* engine) {
  const std::string where = std::string("place.") + engine;
  if (!place.contains(engine)) return invalid(where + " is required (one host per rank)");
  auto list = string_list(place[engine], where, 64 * 16);
  if (!list.ok()) return list.status();
  if (list->empty()) return invalid(where + " must name one host per rank, not be empty");
  for (size_t i = 0; i < list->size(); ++i) {
    if (Status st = check_host_key(hf, (*list)[i], fmt::format("{}[{}]", where, i)); !st.ok()) return st;
  }
  return list;
}

}  // namespace

const HostEntry& HostsFile::rank(bool prefill, uint32_t tp_rank, uint32_t dp_rank) const {
  const auto& list = prefill ? place.prefill : place.decode;
  return host(list.at(size_t(dp_rank) * (prefill ? prefill_tp : decode_tp) + tp_rank));
}

bool HostsFile::engines_apart() const {
  for (const auto& p : place.prefill) {
    for (const auto& d : place.decode) {
      if (p != d) return true;
    }
  }
  return false;
}

std::string HostsFile::to_json() const {
  json hj = json::object();
  for (const auto& [key, h] : hosts) {
    json e = {{"address", h.address}, {"exec", h.exec}};
    if (!h.links.empty()) e["links"] = h.links;
    hj[key] = e;
  }
  json pj = {{"bootstrap", place.bootstrap}, {"router", place.router}, {"replay", place.replay},
             {"prefill", place.prefill},     {"decode", place.decode}};
  return json{{"hosts", hj}, {"place", pj}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<HostsFile> parse_hosts(std::string_view text) {
  if (text.size() > kMaxHostsFileBytes) {
    return invalid(fmt::format("the file has {} bytes, at most {}", text.size(), kMaxHostsFileBytes));
  }
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid("not valid JSON");
  if (!j.is_object()) return invalid("must be a JSON object with \"hosts\" and \"place\"");
  if (Status st = unknown_keys(j, {"hosts", "place"}, "the file"); !st.ok()) return st;
  if (!j.contains("hosts") || !j["hosts"].is_object() || j["hosts"].empty()) {
    return invalid("\"hosts\" is required: an object of host key -> {\"address\": ..., \"exec\": [...]}");
  }
  if (j["hosts"].size() > kMaxHosts) {
    return invalid(fmt::format("\"hosts\" has {} hosts, at most {}", j["hosts"].size(), kMaxHosts));
  }
  HostsFile hf;
  std::map<std::string, std::string> by_address;
  for (const auto& [key, v] : j["hosts"].items()) {
    auto h = parse_host_entry(key, v);
    if (!h.ok()) return h.status();
    if (auto [it, fresh] = by_address.emplace(h->address, key); !fresh) {
      return invalid(fmt::format("hosts.{} and hosts.{} have the same address {}: each host needs its own",
                                 it->second, key, h->address));
    }
    hf.hosts[key] = std::move(*h);
  }
  if (hf.hosts.size() > 1) {
    for (const auto& [key, h] : hf.hosts) {
      if (is_loopback(h.address)) {
        return invalid(fmt::format("hosts.{}.address {} is loopback: with several hosts, every process "
                                   "must reach another host through that host's own address",
                                   key, h.address));
      }
    }
  }
  if (!j.contains("place") || !j["place"].is_object()) {
    return invalid("\"place\" is required: {\"bootstrap\": HOST, \"router\": HOST, \"prefill\": [...], "
                   "\"decode\": [...]}");
  }
  const json& place = j["place"];
  if (Status st = unknown_keys(place, {"bootstrap", "router", "replay", "prefill", "decode"}, "place");
      !st.ok()) {
    return st;
  }
  for (auto [name, field] : {std::pair{"bootstrap", &hf.place.bootstrap}, std::pair{"router", &hf.place.router},
                             std::pair{"replay", &hf.place.replay}}) {
    if (!place.contains(name)) {
      if (std::string_view(name) == "replay") continue;
      return invalid(fmt::format("place.{} is required (a host key)", name));
    }
    if (!place[name].is_string()) return invalid(fmt::format("place.{} must be a host key (a string)", name));
    *field = place[name].get<std::string>();
    if (Status st = check_host_key(hf, *field, std::string("place.") + name); !st.ok()) return st;
  }
  if (hf.place.replay.empty()) hf.place.replay = hf.place.router;
  for (auto [engine, field] : {std::pair{"prefill", &hf.place.prefill}, std::pair{"decode", &hf.place.decode}}) {
    auto list = parse_rank_hosts(hf, place, engine);
    if (!list.ok()) return list.status();
    *field = std::move(*list);
  }
  return hf;
}

Status check_placement(HostsFile& hf, uint32_t prefill_tp, uint32_t prefill_dp, uint32_t decode_tp,
                       uint32_t decode_dp) {
  for (auto [engine, list, tp, dp] : {std::tuple{"prefill", &hf.place.prefill, prefill_tp, prefill_dp},
                                      std::tuple{"decode", &hf.place.decode, decode_tp, decode_dp}}) {
    const size_t want = size_t(tp) * dp;
    if (list->size() != want) {
      return invalid(fmt::format("place.{} names {} hosts but the {} engine has {} ranks (TP {} x DP {}): "
                                 "one host per rank, index dp_rank * {} + tp_rank",
                                 engine, list->size(), engine, want, tp, dp, tp));
    }
  }
  hf.prefill_tp = prefill_tp;
  hf.decode_tp = decode_tp;
  return Status::Ok();
}

Result<HostsFile> load_hosts_file(const std::string& path, uint32_t prefill_tp, uint32_t prefill_dp,
                                  uint32_t decode_tp, uint32_t decode_dp) {
  const std::string where = "--hosts " + path + ": ";
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid(where + "cannot read the file");
  std::string text(kMaxHostsFileBytes + 1, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  auto hf = parse_hosts(text);
  if (!hf.ok()) return invalid(where + hf.status().message());
  if (Status st = check_placement(*hf, prefill_tp, prefill_dp, decode_tp, decode_dp); !st.ok()) {
    return invalid(where + st.message());
  }
  return hf;
}

}  // namespace kvferry::replay
