// Router <-> orchestrator peer-death frames (peer_death_frames.h). Decoding never throws.
#include "replay/peer_death_frames.h"

#include <limits>

#include <nlohmann/json.hpp>

namespace kvferry::replay {
namespace {

using json = nlohmann::json;

Status bad(const std::string& what) { return {ErrorCode::kProtocolError, "peer-death frame: " + what}; }

}  // namespace

std::string encode_peer_death(const std::string& type, const std::string& rank, int64_t time_ns,
                              const std::string& reason) {
  json j = {{"type", type}, {"rank", rank}};
  if (type == "killed" || type == "restarted") j["time_ns"] = time_ns;
  if (type == "kill_failed") j["reason"] = reason;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<std::optional<PeerDeathFrame>> decode_peer_death_frame(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object()) return bad("not a JSON object");
  auto t = j.find("type");
  if (t == j.end() || !t->is_string()) return bad("missing string field 'type'");
  PeerDeathFrame f;
  f.type = t->get<std::string>();
  const bool timed = f.type == "killed" || f.type == "restarted";
  if (f.type != "kill" && !timed && f.type != "kill_failed") return std::optional<PeerDeathFrame>();
  auto rank = j.find("rank");
  if (rank == j.end() || !rank->is_string()) return bad("field 'rank' must be a string");
  f.rank = rank->get<std::string>();
  if (!RankId::parse(f.rank)) return bad("'" + f.rank + "' is not a rank");
  if (timed) {
    auto ns = j.find("time_ns");
    if (ns == j.end() || !ns->is_number_integer()) return bad("field 'time_ns' must be an integer");
    if (ns->is_number_unsigned() &&
        ns->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return bad("field 'time_ns' out of range");
    }
    f.time_ns = ns->get<int64_t>();
  }
  if (f.type == "kill_failed") {
    auto why = j.find("reason");
    if (why == j.end() || !why->is_string()) return bad("field 'reason' must be a string");
    f.reason = why->get<std::string>();
  }
  return std::optional<PeerDeathFrame>(std::move(f));
}

}  // namespace kvferry::replay
