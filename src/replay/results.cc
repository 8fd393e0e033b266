// ReplayResults <-> JSON (results.h). RoomResults reuse the router protocol's codec so both
// files and frames are validated by one decoder.
#include "replay/results.h"

#include <charconv>

#include <nlohmann/json.hpp>

namespace kvferry::replay {
namespace {

using json = nlohmann::json;

Status bad(const std::string& what) { return {ErrorCode::kProtocolError, "results file: " + what}; }

json stats_json(const std::optional<std::vector<RankLeakStats>>& s, Role role) {
  if (!s) return nullptr;
  return json::parse(encode_stats(role, *s))["ranks"];
}

bool get_u64(const json& o, const char* k, uint64_t& v) {
  auto it = o.find(k);
  if (it == o.end() || !it->is_number_unsigned()) return false;
  v = it->get<uint64_t>();
  return true;
}

bool get_i64(const json& o, const char* k, int64_t& v) {
  auto it = o.find(k);
  if (it == o.end() || !it->is_number_integer()) return false;
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)) return false;
  v = it->get<int64_t>();
  return true;
}

Result<std::optional<RoomResult>> result_from(const json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end()) return bad(std::string("missing '") + key + "'");
  if (it->is_null()) return std::optional<RoomResult>();
  if (!it->is_object()) return bad(std::string("'") + key + "' must be an object");
  json frame = *it;
  frame["type"] = "result";
  auto f = decode_router_frame(frame.dump());
  if (!f.ok()) return bad(std::string(key) + ": " + f.status().message());
  return std::optional<RoomResult>(*f->result);
}

Result<std::optional<std::vector<RankLeakStats>>> stats_from(const json& stats, const char* key) {
  auto it = stats.find(key);
  if (it == stats.end() || it->is_null()) return std::optional<std::vector<RankLeakStats>>();
  json frame = {{"type", "stats"}, {"role", key}, {"ranks", *it}};
  auto f = decode_router_frame(frame.dump());
  if (!f.ok()) return bad(std::string("stats.") + key + ": " + f.status().message());
  return std::optional<std::vector<RankLeakStats>>(*f->stats);
}

}  // namespace

std::string final_error(const RequestOutcome& q) {
  const std::string room = std::to_string(q.room);
  if (!q.router_failure.empty()) return "room " + room + " failed: internal at router: " + q.router_failure;
  const bool pf = q.prefill && q.prefill->state == KVPoll::Failed;
  const bool df = q.decode && q.decode->state == KVPoll::Failed;
  if (!pf && !df) return "";
  const RoomResult& main = df ? *q.decode : *q.prefill;
  auto origin = [](const RoomResult& r) { return r.origin.empty() ? std::string("an unnamed rank") : r.origin; };
  std::string e = "room " + room + " failed: " + std::string(code_name(main.code)) + " at " +
                  origin(main) + ": " + main.reason;
  if (df && pf && (q.prefill->origin != q.decode->origin || q.prefill->code != q.decode->code)) {
    e += " (prefill engine: " + std::string(code_name(q.prefill->code)) + " at " + origin(*q.prefill) + ")";
  }
  return e;
}

std::string encode_results(const ReplayResults& r) {
  json reqs = json::array();
  for (const auto& q : r.requests) {
    json o = {{"room", std::to_string(q.room)},
              {"input_tokens", q.input_tokens},
              {"output_tokens", q.output_tokens},
              {"arrival_ms", q.arrival_ms},
              {"dispatched_ns", q.dispatched_ns},
              {"router_failure", q.router_failure},
              {"abort_sent_ns", q.abort_sent_ns},
              {"error", q.error}};
    if (q.prefill_instance != 0) o["prefill_instance"] = q.prefill_instance;  // xPyD only
    if (q.decode_instance != 0) o["decode_instance"] = q.decode_instance;
    o["fault"] = q.fault ? json{{"kind", std::string(fault_kind_name(q.fault->kind))}, {"at", q.fault->at.str()}}
                         : json(nullptr);
    for (auto [key, res] : {std::pair{"prefill", &q.prefill}, std::pair{"decode", &q.decode}}) {
      if (*res) {
        json j = json::parse(encode_result(**res));
        j.erase("type");
        o[key] = std::move(j);
      } else {
        o[key] = nullptr;
      }
    }
    reqs.push_back(std::move(o));
  }
  json out = {{"version", 1},
              {"dispatch_start_ns", r.dispatch_start_ns},
              {"dispatch_end_ns", r.dispatch_end_ns},
              {"last_result_ns", r.last_result_ns},
              {"requests", std::move(reqs)},
              {"stats",
               {{"prefill", stats_json(r.prefill_stats, Role::kPrefill)},
                {"decode", stats_json(r.decode_stats, Role::kDecode)}}}};
  if (!r.scale.empty()) {
    json sc = json::array();
    for (const ScaleRecord& e : r.scale) {
      sc.push_back({{"t_s", e.t_s}, {"join", e.join}, {"role", std::string(role_name(e.role))},
                    {"instance", e.instance}, {"event_ns", e.event_ns}, {"ready_ns", e.ready_ns},
                    {"first_room_ns", e.first_room_ns}, {"in_flight_at_event", e.in_flight_at_event},
                    {"leave_sent_ns", e.leave_sent_ns}, {"left_ns", e.left_ns}, {"rooms", e.rooms},
                    {"failed_rooms_caused", e.failed_rooms_caused}});
    }
    out["scale"] = std::move(sc);
  }
  return out.dump(1, ' ', false, json::error_handler_t::replace);
}

Result<ReplayResults> decode_results(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  ReplayResults r;
  uint64_t version = 0;
  if (!get_u64(j, "version", version) || version != 1) return bad("missing or unknown version");
  if (!get_i64(j, "dispatch_start_ns", r.dispatch_start_ns) ||
      !get_i64(j, "dispatch_end_ns", r.dispatch_end_ns) ||
      !get_i64(j, "last_result_ns", r.last_result_ns)) {
    return bad("missing dispatch times");
  }
  auto reqs = j.find("requests");
  if (reqs == j.end() || !reqs->is_array()) return bad("'requests' must be an array");
  for (const json& o : *reqs) {
    if (!o.is_object()) return bad("request entry must be an object");
    RequestOutcome q;
    auto room = o.find("room");
    if (room == o.end() || !room->is_string()) return bad("request without room");
    const std::string rs = room->get<std::string>();
    auto [ptr, ec] = std::from_chars(rs.data(), rs.data() + rs.size(), q.room);
    if (rs.empty() || ec != std::errc() || ptr != rs.data() + rs.size()) {
      return bad("bad room '" + rs + "'");
    }
    if (!get_u64(o, "input_tokens", q.input_tokens) ||
        !get_u64(o, "output_tokens", q.output_tokens) ||
        !get_u64(o, "arrival_ms", q.arrival_ms) || !get_i64(o, "dispatched_ns", q.dispatched_ns)) {
      return bad("request " + rs + ": missing numeric field");
    }
    auto rf = o.find("router_failure");
    if (rf == o.end() || !rf->is_string()) return bad("request " + rs + ": missing router_failure");
    q.router_failure = rf->get<std::string>();
    // Optional (files of earlier versions lack them).
    if (o.contains("abort_sent_ns") && !get_i64(o, "abort_sent_ns", q.abort_sent_ns)) {
      return bad("request " + rs + ": bad abort_sent_ns");
    }
    for (auto [key, v] : {std::pair{"prefill_instance", &q.prefill_instance}, std::pair{"decode_instance", &q.decode_instance}}) {
      uint64_t n = 0;
      if (!o.contains(key)) continue;
      if (!get_u64(o, key, n) || n > 1024) return bad("request " + rs + ": bad " + key);
      *v = uint32_t(n);
    }
    if (auto e = o.find("error"); e != o.end()) {
      if (!e->is_string()) return bad("request " + rs + ": error must be a string");
      q.error = e->get<std::string>();
    }
    auto f = o.find("fault");
    if (f != o.end() && !f->is_null()) {
      if (!f->is_object() || !f->contains("kind") || !f->contains("at") ||
          !(*f)["kind"].is_string() || !(*f)["at"].is_string()) {
        return bad("request " + rs + ": bad fault");
      }
      q.fault = fault_from_names((*f)["kind"].get<std::string>(), (*f)["at"].get<std::string>());
      if (!q.fault) return bad("request " + rs + ": bad fault");
    }
    auto p = result_from(o, "prefill");
    if (!p.ok()) return p.status();
    q.prefill = *p;
    auto d = result_from(o, "decode");
    if (!d.ok()) return d.status();
    q.decode = *d;
    r.requests.push_back(std::move(q));
  }
  auto stats = j.find("stats");
  if (stats == j.end() || !stats->is_object()) return bad("'stats' must be an object");
  auto ps = stats_from(*stats, "prefill");
  if (!ps.ok()) return ps.status();
  r.prefill_stats = *ps;
  auto ds = stats_from(*stats, "decode");
  if (!ds.ok()) return ds.status();
  r.decode_stats = *ds;
  if (auto sc = j.find("scale"); sc != j.end()) {
    if (!sc->is_array() || sc->size() > 64) return bad("'scale' must be an array of at most 64 entries");
    for (const json& o : *sc) {
      ScaleRecord e;
      uint64_t instance = 0;
      auto t = o.is_object() ? o.find("t_s") : o.end();
      auto join = o.is_object() ? o.find("join") : o.end();
      auto role = o.is_object() ? o.find("role") : o.end();
      if (t == o.end() || !t->is_number() || join == o.end() || !join->is_boolean() || role == o.end() ||
          !role->is_string() || !get_u64(o, "instance", instance) || instance > 1024 ||
          !get_i64(o, "event_ns", e.event_ns) || !get_i64(o, "ready_ns", e.ready_ns) ||
          !get_i64(o, "first_room_ns", e.first_room_ns) || !get_u64(o, "in_flight_at_event", e.in_flight_at_event) ||
          !get_i64(o, "leave_sent_ns", e.leave_sent_ns) || !get_i64(o, "left_ns", e.left_ns) ||
          !get_u64(o, "rooms", e.rooms) || !get_u64(o, "failed_rooms_caused", e.failed_rooms_caused)) {
        return bad("bad scale entry");
      }
      const std::string rn = role->get<std::string>();
      if (rn != "prefill" && rn != "decode") return bad("bad scale role '" + rn + "'");
      e.t_s = t->get<double>();
      e.join = join->get<bool>();
      e.role = rn == "prefill" ? Role::kPrefill : Role::kDecode;
      e.instance = uint32_t(instance);
      r.scale.push_back(e);
    }
  }
  return r;
}

}  // namespace kvferry::replay
