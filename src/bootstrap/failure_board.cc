// FailureBoard (bootstrap/failure_board.h).
#include "bootstrap/failure_board.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <optional>

#include "bootstrap/rank_info_json.h"
#include "core/failure_json.h"

namespace kvferry::bootstrap {
namespace {

Reply error(int status, const std::string& message) { return {status, error_body(message), "application/json"}; }

std::optional<uint64_t> parse_room(const std::string& s) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || s.size() > 20 || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

Reply FailureBoard::post(const nlohmann::json& body, const std::string& source, int64_t now_ns, int64_t wall_now_ns) {
  if (!body.is_object()) return error(400, "body: expected a JSON object");
  auto it = body.find("room");
  if (it == body.end() || !it->is_string()) return error(400, "field 'room': expected a decimal string");
  const std::optional<uint64_t> room = parse_room(it->get<std::string>());
  if (!room) return error(400, "field 'room': expected an unsigned 64-bit integer in decimal");
  Result<Failure> f = get_failure(body, "failure");
  if (!f.ok()) return error(400, f.status().message());
  Failure record = std::move(f).value();
  if (record.wall_ns == 0) return error(400, "field 'wall_ns': required on the failure board");
  if (record.wall_ns > wall_now_ns + kFailureBoardClockSlackNs || record.wall_ns < wall_now_ns - kFailureBoardClockSlackNs)
    return error(400, "field 'wall_ns': more than 300 s away from this host's clock");
  if (record.reason.size() > kFailureBoardReasonBytes) record.reason.resize(kFailureBoardReasonBytes);

  std::lock_guard lock(mu_);
  expire(now_ns);
  auto held = rooms_.find(*room);
  if (held != rooms_.end()) {
    if (!failure_precedes(record, held->second.record)) return {200, R"({"ok":true,"kept":"held"})", "application/json"};
    if (held->second.source != source && per_source_[source] >= kFailureBoardRoomsPerSource)
      return error(429, "too many failure records from " + source);
    // The earlier cause replaces the held record; the room keeps its place in the expiry order.
    if (--per_source_[held->second.source] == 0) per_source_.erase(held->second.source);
    ++per_source_[source];
    held->second.record = std::move(record);
    held->second.source = source;
    return {200, R"({"ok":true,"kept":"posted"})", "application/json"};
  }
  // Full: the oldest record goes. A record is needed for seconds (ranks ask as their engine agrees),
  // so a flood evicts nothing a rank still asks for unless it posts 65536 records in that time;
  // refusing instead would let four addresses lock every real post out.
  while (rooms_.size() >= kFailureBoardRooms && !order_.empty()) {
    auto [old_room, posted] = order_.front();
    order_.pop_front();
    auto old_it = rooms_.find(old_room);
    if (old_it != rooms_.end() && old_it->second.posted_ns == posted) drop(old_room);
  }
  if (per_source_[source] >= kFailureBoardRoomsPerSource) return error(429, "too many failure records from " + source);
  ++per_source_[source];
  rooms_.emplace(*room, Entry{std::move(record), source, now_ns});
  order_.emplace_back(*room, now_ns);
  return {200, R"({"ok":true,"kept":"posted"})", "application/json"};
}

Reply FailureBoard::get(const std::string* room_param, int64_t now_ns) {
  if (!room_param) return error(400, "query parameter 'room': missing");
  const std::optional<uint64_t> room = parse_room(*room_param);
  if (!room) return error(400, "query parameter 'room': expected an unsigned 64-bit integer in decimal");
  std::lock_guard lock(mu_);
  expire(now_ns);
  auto it = rooms_.find(*room);
  if (it == rooms_.end()) return error(404, "no failure posted for room " + *room_param);
  nlohmann::json j = {{"room", std::to_string(*room)}};
  put_failure(j, it->second.record);
  return {200, dump(j), "application/json"};
}

size_t FailureBoard::size() const {
  std::lock_guard lock(mu_);
  return rooms_.size();
}

void FailureBoard::drop(uint64_t room) {
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return;
  if (--per_source_[it->second.source] == 0) per_source_.erase(it->second.source);
  rooms_.erase(it);
}

void FailureBoard::expire(int64_t now_ns) {
  while (!order_.empty() && now_ns - order_.front().second >= kFailureBoardTtlNs) {
    auto [room, posted] = order_.front();
    order_.pop_front();
    auto it = rooms_.find(room);
    if (it != rooms_.end() && it->second.posted_ns == posted) drop(room);
  }
}

}  // namespace kvferry::bootstrap
