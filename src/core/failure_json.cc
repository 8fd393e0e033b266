// JSON codec of the failure record (see failure_json.h).
#include "core/failure_json.h"

#include <cstdint>
#include <string>

namespace kvferry {
namespace {

template <typename J>
void put(J& j, const Failure& f) {
  j["code"] = std::string(code_name(f.code));
  j["origin"] = f.origin.str();
  j["reason"] = f.reason;
  j["first_seen_ns"] = f.first_seen_ns;
  j["wall_ns"] = f.wall_ns;
}

Status bad(std::string_view what, std::string_view field, std::string_view why) {
  std::string m(what);
  if (!field.empty()) m.append(".").append(field);
  m.append(": ").append(why);
  return Status(ErrorCode::kProtocolError, std::move(m));
}

std::string quoted(std::string_view value, std::string_view why) {
  std::string m = "'";
  m.append(value).append("' ").append(why);
  return m;
}

// Reads a non-negative integer field; `optional`: absent gives 0.
Status get_time(const nlohmann::json& j, std::string_view what, const char* key, bool optional, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (optional) return Status::Ok();
    return bad(what, key, "missing");
  }
  if (!it->is_number_integer()) return bad(what, key, "not an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return bad(what, key, "out of range");
  const int64_t v = it->get<int64_t>();
  if (v < 0) return bad(what, key, "negative");
  *out = v;
  return Status::Ok();
}

}  // namespace

void put_failure(nlohmann::json& j, const Failure& f) { put(j, f); }
void put_failure(nlohmann::ordered_json& j, const Failure& f) { put(j, f); }

Result<Failure> get_failure(const nlohmann::json& j, std::string_view what) {
  if (!j.is_object()) return bad(what, "", "not an object");
  Failure f;
  auto code = j.find("code");
  if (code == j.end()) return bad(what, "code", "missing");
  if (!code->is_string()) return bad(what, "code", "not a string");
  auto c = code_from_name(code->get_ref<const std::string&>());
  if (!c || *c == ErrorCode::kOk) return bad(what, "code", quoted(code->get_ref<const std::string&>(), "is not a failure code"));
  f.code = *c;
  auto origin = j.find("origin");
  if (origin == j.end()) return bad(what, "origin", "missing");
  if (!origin->is_string()) return bad(what, "origin", "not a string");
  auto o = RankId::parse(origin->get_ref<const std::string&>());
  if (!o) return bad(what, "origin", quoted(origin->get_ref<const std::string&>(), "is not a rank"));
  f.origin = *o;
  auto reason = j.find("reason");
  if (reason == j.end()) return bad(what, "reason", "missing");
  if (!reason->is_string()) return bad(what, "reason", "not a string");
  f.reason = reason->get<std::string>().substr(0, kMaxFailureReasonBytes);
  if (Status s = get_time(j, what, "first_seen_ns", false, &f.first_seen_ns); !s.ok()) return s;
  if (Status s = get_time(j, what, "wall_ns", true, &f.wall_ns); !s.ok()) return s;
  return f;
}

}  // namespace kvferry
