#include "driver/sync_codec.h"

#include <nlohmann/json.hpp>

#include "core/failure_json.h"

#include <string>

namespace kvferry {
namespace {
using nlohmann::json;

std::string room_str(uint64_t room) { return std::to_string(room); }
uint64_t room_of(const json& j) { return std::stoull(j.at("room").get<std::string>()); }

// The failure record's shared codec (core/failure_json.h); a bad record fails the frame.
Failure failure_from(const json& j, std::string_view what) {
  auto f = get_failure(j, what);
  if (!f.ok()) throw std::runtime_error(f.status().message());
  return *f;
}

json to_json(const Decision& d) {
  json j{{"op", static_cast<int>(d.op)}, {"room", room_str(d.room)}};
  switch (d.op) {
    case Decision::Op::kNew: {
      j["input_tokens"] = d.request.input_tokens;
      j["output_tokens"] = d.request.output_tokens;
      j["arrival_ms"] = d.request.arrival_ms;
      if (d.request.fault)
        j["fault"] = {{"kind", std::string(fault_kind_name(d.request.fault->kind))}, {"at", d.request.fault->at.str()}};
      if (!d.request.prefill_bootstrap.empty()) j["bootstrap"] = d.request.prefill_bootstrap;
      break;
    }
    case Decision::Op::kFail:
      put_failure(j, failure_of(d));
      break;
    case Decision::Op::kRelease:
      j["quarantine"] = d.quarantine;
      if (d.code != ErrorCode::kOk) put_failure(j, failure_of(d));  // the engine's root cause
      break;
    default:
      break;
  }
  return j;
}

Decision decision_from(const json& j) {
  Decision d;
  int op = j.at("op").get<int>();
  if (op < 0 || op > static_cast<int>(Decision::Op::kReclaim)) throw std::runtime_error("bad op");
  d.op = static_cast<Decision::Op>(op);
  d.room = room_of(j);
  d.request.room = d.room;
  if (d.op == Decision::Op::kNew) {
    d.request.input_tokens = j.at("input_tokens").get<uint64_t>();
    d.request.output_tokens = j.at("output_tokens").get<uint64_t>();
    d.request.arrival_ms = j.at("arrival_ms").get<uint64_t>();
    if (j.contains("fault")) {
      d.request.fault = fault_from_names(j["fault"].at("kind").get<std::string>(), j["fault"].at("at").get<std::string>());
      if (!d.request.fault) throw std::runtime_error("bad fault");
    }
    if (j.contains("bootstrap")) {
      d.request.prefill_bootstrap = j["bootstrap"].get<std::string>();
      if (d.request.prefill_bootstrap.empty() || d.request.prefill_bootstrap.size() > 255)
        throw std::runtime_error("bad bootstrap");
    }
  } else if (d.op == Decision::Op::kFail) {
    set_failure(d, failure_from(j, "decision"));
  } else if (d.op == Decision::Op::kRelease) {
    d.quarantine = j.at("quarantine").get<bool>();
    if (j.contains("code")) set_failure(d, failure_from(j, "release"));
  }
  return d;
}

json to_json(const RoomReport& r) {
  // A quarantined room reclaimed on this rank: the room and the rank, nothing else.
  if (r.reclaimed) return json{{"room", room_str(r.room)}, {"tp", r.tp_rank}, {"reclaimed", true}};
  json j{{"room", room_str(r.room)}, {"tp", r.tp_rank}, {"poll", static_cast<int>(r.poll)},
         {"drained", r.drained}, {"q", r.quarantine}, {"failed_ns", r.failed_ns}, {"send_ns", r.send_ns},
         {"success_ns", r.success_ns}, {"bytes", r.bytes}, {"verified", r.verified}, {"mismatched", r.mismatched}};
  if (r.compute_end_ns != 0) j["compute_end_ns"] = r.compute_end_ns;  // the compute model only
  if (r.has_failure) put_failure(j, failure_of(r));
  return j;
}

RoomReport report_from(const json& j) {
  RoomReport r;
  r.room = room_of(j);
  r.tp_rank = j.at("tp").get<uint32_t>();
  if (j.contains("reclaimed")) {
    if (!j.at("reclaimed").get<bool>()) throw std::runtime_error("'reclaimed' is only ever true");
    r.reclaimed = true;
    return r;
  }
  auto p = poll_from_int(j.at("poll").get<int>());
  if (!p) throw std::runtime_error("bad poll");
  r.poll = *p;
  r.drained = j.at("drained").get<bool>();
  r.quarantine = j.at("q").get<bool>();
  r.failed_ns = j.at("failed_ns").get<int64_t>();
  r.send_ns = j.at("send_ns").get<int64_t>();
  r.success_ns = j.at("success_ns").get<int64_t>();
  r.bytes = j.at("bytes").get<uint64_t>();
  r.verified = j.at("verified").get<uint64_t>();
  r.mismatched = j.at("mismatched").get<uint64_t>();
  if (j.contains("compute_end_ns")) r.compute_end_ns = j.at("compute_end_ns").get<int64_t>();
  if (j.contains("code")) {
    const Failure f = failure_from(j, "report");
    r.has_failure = true;
    r.code = f.code;
    r.origin = f.origin.str();
    r.reason = f.reason;
    r.first_seen_ns = f.first_seen_ns;
    r.wall_ns = f.wall_ns;
  }
  return r;
}

}  // namespace

std::string encode_decision_json(const Decision& d) { return to_json(d).dump(); }
std::string encode_report_json(const RoomReport& r) { return to_json(r).dump(); }

std::string encode_hello(uint32_t tp_rank, const std::string& endpoint) {
  return json{{"type", "hello"}, {"tp_rank", tp_rank}, {"endpoint", endpoint}}.dump();
}

std::string encode_step(uint64_t seq, bool shutdown, const std::vector<Decision>& decisions,
                        const std::vector<EngineMember>* members, bool leave) {
  json arr = json::array();
  for (const Decision& d : decisions) arr.push_back(to_json(d));
  json j{{"type", "step"}, {"seq", seq}, {"shutdown", shutdown}, {"decisions", std::move(arr)}};
  if (leave) j["leave"] = true;
  if (members) {
    json m = json::array();
    for (const EngineMember& x : *members) m.push_back({{"tp", x.tp_rank}, {"endpoint", x.endpoint}});
    j["members"] = std::move(m);
  }
  return j.dump();
}

std::string encode_fail(const SiblingFailure& f) {
  json j{{"type", "fail"}, {"tp_rank", f.tp_rank}, {"room", room_str(f.room)}};
  put_failure(j, failure_of(f));
  return j.dump();
}

std::string encode_hi(uint32_t tp_rank) { return json{{"type", "hi"}, {"tp_rank", tp_rank}}.dump(); }

std::string encode_down(const std::string& reason) { return json{{"type", "down"}, {"reason", reason}}.dump(); }

std::string encode_reply(uint64_t seq, uint32_t tp_rank, const std::vector<RoomReport>& rooms,
                         const RankLeakStats& stats) {
  json arr = json::array();
  for (const RoomReport& r : rooms) arr.push_back(to_json(r));
  json st{{"rank", stats.rank}, {"live_rooms", stats.live_rooms}, {"records", stats.records},
          {"pages_in_use", stats.pages_in_use}, {"peers", stats.peers},
          {"quarantined_pages", stats.quarantined_pages}, {"reclaimed_pages", stats.reclaimed_pages}};
  return json{{"type", "reply"}, {"seq", seq}, {"tp_rank", tp_rank}, {"rooms", std::move(arr)}, {"stats", st}}.dump();
}

Result<SyncFrame> decode_sync_frame(const std::string& text) {
  try {
    // Nothing in an engine frame is a fraction: a float (e.g. an integer too large for 64 bits,
    // which the parser keeps as a double) is refused here, since converting it to an integer
    // field would be undefined behaviour (found by fuzz/engine_sync_fuzz.cc).
    json j = json::parse(text, [](int, json::parse_event_t event, json& value) {
      if (event == json::parse_event_t::value && value.is_number_float())
        throw std::runtime_error("a number that is not an integer of at most 64 bits");
      return true;
    });
    SyncFrame f;
    f.type = j.at("type").get<std::string>();
    f.raw = text;
    if (f.type == "hello") {
      f.tp_rank = j.at("tp_rank").get<uint32_t>();
      f.endpoint = j.at("endpoint").get<std::string>();
    } else if (f.type == "step") {
      f.seq = j.at("seq").get<uint64_t>();
      f.shutdown = j.at("shutdown").get<bool>();
      if (j.contains("leave")) f.leave = j.at("leave").get<bool>();
      for (const json& d : j.at("decisions")) f.decisions.push_back(decision_from(d));
      if (j.contains("members")) {
        f.has_members = true;
        for (const json& m : j.at("members")) {
          EngineMember x{m.at("tp").get<uint32_t>(), m.at("endpoint").get<std::string>()};
          if (x.endpoint.empty()) throw std::runtime_error("empty member endpoint");
          f.members.push_back(std::move(x));
        }
      }
    } else if (f.type == "fail") {
      f.tp_rank = j.at("tp_rank").get<uint32_t>();
      f.fail.tp_rank = f.tp_rank;
      f.fail.room = room_of(j);
      f.room = f.fail.room;
      const Failure rec = failure_from(j, "fail");
      f.fail.code = rec.code;
      f.fail.origin = rec.origin.str();
      f.fail.reason = rec.reason;
      f.fail.first_seen_ns = rec.first_seen_ns;
      f.fail.wall_ns = rec.wall_ns;
    } else if (f.type == "hi") {
      f.tp_rank = j.at("tp_rank").get<uint32_t>();
    } else if (f.type == "down") {
      f.reason = j.at("reason").get<std::string>();
      if (f.reason.size() > 4096) throw std::runtime_error("down reason too long");
    } else if (f.type == "abort") {
      f.room = room_of(j);
    } else if (f.type == "reply") {
      f.seq = j.at("seq").get<uint64_t>();
      f.tp_rank = j.at("tp_rank").get<uint32_t>();
      for (const json& r : j.at("rooms")) f.rooms.push_back(report_from(r));
      const json& st = j.at("stats");
      f.stats.rank = st.at("rank").get<std::string>();
      f.stats.live_rooms = st.at("live_rooms").get<uint64_t>();
      f.stats.records = st.at("records").get<uint64_t>();
      f.stats.pages_in_use = st.at("pages_in_use").get<uint64_t>();
      f.stats.peers = st.at("peers").get<uint64_t>();
      f.stats.quarantined_pages = st.value("quarantined_pages", uint64_t{0});  // older ranks: absent
      f.stats.reclaimed_pages = st.value("reclaimed_pages", uint64_t{0});
    }
    return f;
  } catch (const std::exception& e) {
    return Status(ErrorCode::kProtocolError, std::string("bad engine frame: ") + e.what());
  }
}

}  // namespace kvferry
