// The replay's planned scaling (scale_plan.h).
#include "replay/scale_plan.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace kvferry::replay {
namespace {

Status invalid(const std::string& msg) { return {ErrorCode::kInvalidArgument, "--scale: " + msg}; }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

}  // namespace

std::string ScaleEvent::str() const {
  return fmt::format("t={}s:{}{}", t_s, join ? '+' : '-', role_name(role));
}

Result<std::vector<ScaleEvent>> parse_scale(const std::string& spec, uint32_t prefill_instances,
                                            uint32_t decode_instances) {
  std::vector<ScaleEvent> events;
  if (spec.empty()) return events;
  const auto items = split(spec, ',');
  if (items.size() > kMaxScaleEvents) {
    return invalid(fmt::format("at most {} events, got {}", kMaxScaleEvents, items.size()));
  }
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    if (item.rfind("t=", 0) != 0 || colon == std::string::npos || colon < 4 || item[colon - 1] != 's') {
      return invalid(fmt::format("'{}' is not of the form t=<seconds>s:+prefill (or -prefill, +decode, -decode)", item));
    }
    ScaleEvent e;
    const char* first = item.data() + 2;
    const char* last = item.data() + colon - 1;
    auto [end, ec] = std::from_chars(first, last, e.t_s);
    if (ec != std::errc() || end != last || !std::isfinite(e.t_s) || e.t_s < 0 || e.t_s > 86400) {
      return invalid(fmt::format("'{}': the time must be a number of seconds in [0, 86400]", item));
    }
    const std::string action = item.substr(colon + 1);
    if (action.empty() || (action[0] != '+' && action[0] != '-')) {
      return invalid(fmt::format("'{}': the action must be +prefill, -prefill, +decode or -decode", item));
    }
    e.join = action[0] == '+';
    const std::string role = action.substr(1);
    if (role == "prefill") {
      e.role = Role::kPrefill;
    } else if (role == "decode") {
      e.role = Role::kDecode;
    } else {
      return invalid(fmt::format("'{}': unknown role '{}' (prefill or decode)", item, role));
    }
    events.push_back(e);
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const ScaleEvent& a, const ScaleEvent& b) { return a.t_s < b.t_s; });
  // Resolve the instances in time order: live[role] holds the live instances' indices.
  std::vector<uint32_t> live[2];
  uint32_t started[2] = {prefill_instances, decode_instances};
  for (uint32_t i = 0; i < prefill_instances; ++i) live[0].push_back(i);
  for (uint32_t i = 0; i < decode_instances; ++i) live[1].push_back(i);
  for (ScaleEvent& e : events) {
    const size_t r = e.role == Role::kPrefill ? 0 : 1;
    if (e.join) {
      if (started[r] >= kMaxInstancesPerRole) {
        return invalid(fmt::format("{}: more than {} {} instances started in all", e.str(), kMaxInstancesPerRole,
                                   role_name(e.role)));
      }
      e.instance = started[r]++;
      live[r].push_back(e.instance);
    } else {
      if (live[r].size() <= 1) {
        return invalid(fmt::format("{}: it would remove the last live {} instance", e.str(), role_name(e.role)));
      }
      auto highest = std::max_element(live[r].begin(), live[r].end());
      e.instance = *highest;
      live[r].erase(highest);
    }
  }
  return events;
}

uint32_t total_instances(const std::vector<ScaleEvent>& events, Role role, uint32_t initial) {
  uint32_t n = initial;
  for (const ScaleEvent& e : events) n += e.join && e.role == role ? 1 : 0;
  return n;
}

}  // namespace kvferry::replay
