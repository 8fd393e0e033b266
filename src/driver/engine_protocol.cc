// Router <-> engine-leader frames (engine_protocol.h) as JSON text. Decoding never throws: every
// field is type-checked before it is read and any problem is kProtocolError naming the field.
#include "driver/engine_protocol.h"

#include <charconv>
#include <limits>

#include <nlohmann/json.hpp>

namespace kvferry {
namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Status bad(const std::string& what) { return {ErrorCode::kProtocolError, "router frame: " + what}; }

// Decimal u64 without sign, spaces or leading zeros (except "0").
std::optional<uint64_t> parse_room(const std::string& s) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// Field readers: return false (and set `err`) when the field is missing or of the wrong type.
class Reader {
 public:
  explicit Reader(const json& obj) : obj_(obj) {}
  const std::string& error() const { return err_; }
  bool failed() const { return !err_.empty(); }

  const json* field(const char* key) {
    auto it = obj_.find(key);
    if (it == obj_.end()) {
      fail(std::string("missing field '") + key + "'");
      return nullptr;
    }
    return &*it;
  }
  uint64_t u64(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return 0;
    if (!v->is_number_unsigned()) {
      fail(std::string("field '") + key + "' must be a non-negative integer");
      return 0;
    }
    return v->get<uint64_t>();
  }
  uint32_t u32(const char* key) {
    const uint64_t v = u64(key);
    if (v > std::numeric_limits<uint32_t>::max()) {
      fail(std::string("field '") + key + "' out of range");
      return 0;
    }
    return static_cast<uint32_t>(v);
  }
  int64_t i64(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return 0;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(std::string("field '") + key + "' out of range");
        return 0;
      }
      return static_cast<int64_t>(u);
    }
    if (!v->is_number_integer()) {
      fail(std::string("field '") + key + "' must be an integer");
      return 0;
    }
    return v->get<int64_t>();
  }
  std::string str(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return {};
    if (!v->is_string()) {
      fail(std::string("field '") + key + "' must be a string");
      return {};
    }
    return v->get<std::string>();
  }
  bool boolean(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return false;
    if (!v->is_boolean()) {
      fail(std::string("field '") + key + "' must be a boolean");
      return false;
    }
    return v->get<bool>();
  }
  uint64_t room(const char* key) {
    const std::string s = str(key);
    if (failed()) return 0;
    auto v = parse_room(s);
    if (!v) {
      fail(std::string("field '") + key + "' must be a decimal u64 string, got '" + s + "'");
      return 0;
    }
    return *v;
  }
  Role role(const char* key) {
    const std::string s = str(key);
    if (failed()) return Role::kPrefill;
    if (s == "prefill") return Role::kPrefill;
    if (s == "decode") return Role::kDecode;
    fail(std::string("field '") + key + "' must be \"prefill\" or \"decode\", got '" + s + "'");
    return Role::kPrefill;
  }
  void fail(std::string e) {
    if (err_.empty()) err_ = std::move(e);
  }

 private:
  const json& obj_;
  std::string err_;
};

bool valid_rank_string(const std::string& s) { return RankId::parse(s).has_value(); }

Result<RouterRequest> decode_request(const json& j) {
  Reader r(j);
  RouterRequest q;
  q.room = r.room("room");
  q.input_tokens = r.u64("input_tokens");
  q.output_tokens = r.u64("output_tokens");
  q.arrival_ms = r.u64("arrival_ms");
  const json* f = r.field("fault");
  if (r.failed()) return bad(r.error());
  if (!f->is_null()) {
    if (!f->is_object()) return bad("field 'fault' must be null or an object");
    Reader fr(*f);
    const std::string kind = fr.str("kind");
    const std::string at = fr.str("at");
    if (fr.failed()) return bad("fault: " + fr.error());
    auto k = fault_kind_from_name(kind);
    if (!k || *k == FaultKind::kAbort) {
      return bad("fault kind must be \"transfer\", \"decode_fail\", \"prefill_fail\", \"timeout\" or "
                 "\"corrupt\", got '" + kind + "'");
    }
    auto rank = RankId::parse(at);
    if (!rank) return bad("fault 'at' is not a rank: '" + at + "'");
    FaultSpec spec{*k, *rank};
    q.fault = std::move(spec);
  }
  if (auto b = j.find("bootstrap"); b != j.end()) {
    if (!b->is_string() || b->get_ref<const std::string&>().empty() || b->get_ref<const std::string&>().size() > 255) {
      return bad("request 'bootstrap' must be a non-empty string of at most 255 bytes");
    }
    q.prefill_bootstrap = b->get<std::string>();
  }
  if (q.input_tokens == 0) return bad("input_tokens must be > 0");
  return q;
}

Result<RoomResult> decode_result(const json& j) {
  Reader r(j);
  RoomResult res;
  res.role = r.role("role");
  res.room = r.room("room");
  const std::string state = r.str("state");
  res.rejected = r.boolean("rejected");
  const std::string code = r.str("code");
  res.origin = r.str("origin");
  res.reason = r.str("reason");
  res.first_send_ns = r.i64("first_send_ns");
  if (j.contains("compute_end_ns")) res.compute_end_ns = r.i64("compute_end_ns");
  res.success_ns = r.i64("success_ns");
  res.failed_all_ns = r.i64("failed_all_ns");
  res.first_failed_ns = r.i64("first_failed_ns");
  if (j.contains("first_failed_wall_ns")) res.first_failed_wall_ns = r.i64("first_failed_wall_ns");
  res.bytes_transferred = r.u64("bytes_transferred");
  res.bytes_verified = r.u64("bytes_verified");
  res.bytes_mismatched = r.u64("bytes_mismatched");
  res.ranks_failed = r.u32("ranks_failed");
  res.ranks_lost = r.u32("ranks_lost");
  if (r.failed()) return bad(r.error());
  if (state == "Success") {
    res.state = KVPoll::Success;
  } else if (state == "Failed") {
    res.state = KVPoll::Failed;
  } else {
    return bad("result state must be \"Success\" or \"Failed\", got '" + state + "'");
  }
  auto c = code_from_name(code);
  if (!c) return bad("unknown code '" + code + "'");
  res.code = *c;
  if (!res.origin.empty() && !valid_rank_string(res.origin)) {
    return bad("result origin is not a rank: '" + res.origin + "'");
  }
  if (res.state == KVPoll::Success && res.code != ErrorCode::kOk) {
    return bad("a successful result must carry code ok");
  }
  if (res.state == KVPoll::Failed && res.code == ErrorCode::kOk) {
    return bad("a failed result must carry a failure code");
  }
  if (res.rejected && res.state != KVPoll::Failed) return bad("a rejected result must be Failed");
  return res;
}

Result<std::vector<RankLeakStats>> decode_stats(const json& j) {
  Reader r(j);
  const json* ranks = r.field("ranks");
  if (r.failed()) return bad(r.error());
  if (!ranks->is_array()) return bad("field 'ranks' must be an array");
  std::vector<RankLeakStats> out;
  for (const json& e : *ranks) {
    if (!e.is_object()) return bad("stats rank entry must be an object");
    Reader er(e);
    RankLeakStats s;
    s.rank = er.str("rank");
    s.live_rooms = er.u64("live_rooms");
    s.records = er.u64("records");
    s.pages_in_use = er.u64("pages_in_use");
    s.peers = er.u64("peers");
    if (e.contains("quarantined_pages")) s.quarantined_pages = er.u64("quarantined_pages");
    if (e.contains("reclaimed_pages")) s.reclaimed_pages = er.u64("reclaimed_pages");
    if (er.failed()) return bad("stats: " + er.error());
    if (!valid_rank_string(s.rank)) return bad("stats rank is not a rank: '" + s.rank + "'");
    out.push_back(std::move(s));
  }
  return out;
}

// An optional unsigned field (absent: 0).
Result<uint32_t> optional_u32(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return uint32_t{0};
  if (!it->is_number_unsigned() || it->get<uint64_t>() > UINT32_MAX) {
    return bad(std::string("field '") + name + "' must be an unsigned 32-bit integer");
  }
  return it->get<uint32_t>();
}

}  // namespace

std::string_view fault_kind_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::kTransfer: return "transfer";
    case FaultKind::kDecodeFail: return "decode_fail";
    case FaultKind::kPrefillFail: return "prefill_fail";
    case FaultKind::kTimeout: return "timeout";
    case FaultKind::kAbort: return "abort";
    case FaultKind::kCorrupt: return "corrupt";
  }
  return "unknown";
}

std::optional<FaultKind> fault_kind_from_name(std::string_view name) {
  for (FaultKind k : {FaultKind::kTransfer, FaultKind::kDecodeFail, FaultKind::kPrefillFail,
                      FaultKind::kTimeout, FaultKind::kAbort, FaultKind::kCorrupt}) {
    if (fault_kind_name(k) == name) return k;
  }
  return std::nullopt;
}

std::string FaultSpec::str() const { return std::string(fault_kind_name(kind)) + "@" + at.str(); }

std::optional<FaultSpec> fault_from_names(std::string_view kind, std::string_view at) {
  auto k = fault_kind_from_name(kind);
  auto r = RankId::parse(at);
  if (!k || !r) return std::nullopt;
  return FaultSpec{*k, *r};
}

std::string encode_request(const RouterRequest& r) {
  json j = {{"type", "request"},
            {"room", std::to_string(r.room)},
            {"input_tokens", r.input_tokens},
            {"output_tokens", r.output_tokens},
            {"arrival_ms", r.arrival_ms}};
  if (r.fault) {
    j["fault"] = {{"kind", std::string(fault_kind_name(r.fault->kind))}, {"at", r.fault->at.str()}};
  } else {
    j["fault"] = nullptr;
  }
  if (!r.prefill_bootstrap.empty()) j["bootstrap"] = r.prefill_bootstrap;
  return dump(j);
}

std::string encode_shutdown() { return dump(json{{"type", "shutdown"}}); }
std::string encode_leave() { return dump(json{{"type", "leave"}}); }

std::string encode_ready(Role role, uint32_t tp_size, uint32_t dp_rank, const std::string& endpoint,
                         uint32_t instance) {
  json j{{"type", "ready"}, {"role", std::string(role_name(role))}, {"tp_size", tp_size}};
  if (dp_rank != 0) j["dp_rank"] = dp_rank;
  if (instance != 0) j["instance"] = instance;
  if (!endpoint.empty()) j["endpoint"] = endpoint;
  return dump(j);
}

std::string encode_result(const RoomResult& r) {
  json j = {{"type", "result"},
            {"role", std::string(role_name(r.role))},
            {"room", std::to_string(r.room)},
            {"state", std::string(to_string(r.state))},
            {"rejected", r.rejected},
            {"code", std::string(code_name(r.code))},
            {"origin", r.origin},
            {"reason", r.reason},
            {"first_send_ns", r.first_send_ns},
            {"success_ns", r.success_ns},
            {"failed_all_ns", r.failed_all_ns},
            {"first_failed_ns", r.first_failed_ns},
            {"first_failed_wall_ns", r.first_failed_wall_ns},
            {"bytes_transferred", r.bytes_transferred},
            {"bytes_verified", r.bytes_verified},
            {"bytes_mismatched", r.bytes_mismatched},
            {"ranks_failed", r.ranks_failed},
            {"ranks_lost", r.ranks_lost}};
  if (r.compute_end_ns != 0) j["compute_end_ns"] = r.compute_end_ns;  // the compute model only
  return dump(j);
}

std::string encode_stats(Role role, const std::vector<RankLeakStats>& ranks, uint32_t dp_rank,
                         uint32_t instance) {
  json arr = json::array();
  for (const auto& s : ranks) {
    arr.push_back({{"rank", s.rank},
                   {"live_rooms", s.live_rooms},
                   {"records", s.records},
                   {"pages_in_use", s.pages_in_use},
                   {"peers", s.peers},
                   {"quarantined_pages", s.quarantined_pages},
                   {"reclaimed_pages", s.reclaimed_pages}});
  }
  json j{{"type", "stats"}, {"role", std::string(role_name(role))}, {"ranks", arr}};
  if (dp_rank != 0) j["dp_rank"] = dp_rank;
  if (instance != 0) j["instance"] = instance;
  return dump(j);
}

std::string encode_abort(uint64_t room) {
  return dump(json{{"type", "abort"}, {"room", std::to_string(room)}});
}

std::string encode_rank_up(const RankId& rank) {
  return dump(json{{"type", "rank_up"}, {"rank", rank.str()}});
}

Result<RouterFrame> decode_router_frame(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object()) return bad("not a JSON object");
  auto t = j.find("type");
  if (t == j.end() || !t->is_string()) return bad("missing string field 'type'");
  RouterFrame f;
  f.type = t->get<std::string>();
  if (f.type == "request") {
    auto q = decode_request(j);
    if (!q.ok()) return q.status();
    f.request = std::move(q).value();
  } else if (f.type == "shutdown" || f.type == "leave") {
    // no fields
  } else if (f.type == "ready") {
    Reader r(j);
    f.ready_role = r.role("role");
    f.ready_tp_size = r.u32("tp_size");
    if (r.failed()) return bad(r.error());
    if (f.ready_tp_size == 0) return bad("ready tp_size must be > 0");
    if (auto dp = optional_u32(j, "dp_rank"); !dp.ok()) return dp.status();
    else f.dp_rank = *dp;
    if (auto in = optional_u32(j, "instance"); !in.ok()) return in.status();
    else f.instance = *in;
    if (auto e = j.find("endpoint"); e != j.end()) {
      if (!e->is_string()) return bad("ready 'endpoint' must be a string");
      f.ready_endpoint = e->get<std::string>();
    }
  } else if (f.type == "result") {
    auto res = decode_result(j);
    if (!res.ok()) return res.status();
    f.result = std::move(res).value();
  } else if (f.type == "stats") {
    Reader r(j);
    f.stats_role = r.role("role");
    if (r.failed()) return bad(r.error());
    if (auto dp = optional_u32(j, "dp_rank"); !dp.ok()) return dp.status();
    else f.dp_rank = *dp;
    if (auto in = optional_u32(j, "instance"); !in.ok()) return in.status();
    else f.instance = *in;
    auto s = decode_stats(j);
    if (!s.ok()) return s.status();
    f.stats = std::move(s).value();
  } else if (f.type == "abort") {
    Reader r(j);
    f.abort_room = r.room("room");
    if (r.failed()) return bad(r.error());
  } else if (f.type == "rank_up") {
    auto rank = j.find("rank");
    if (rank == j.end() || !rank->is_string()) return bad("rank_up needs a string 'rank'");
    f.up_rank = RankId::parse(rank->get_ref<const std::string&>());
    if (!f.up_rank) return bad("rank_up 'rank' is not a rank");
  } else {
    return bad("unknown type '" + f.type + "'");
  }
  return f;
}

}  // namespace kvferry
