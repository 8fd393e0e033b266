// The report's --scale figures (report.h add_scale_events(), docs/report.md "Scaling while serving").
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "replay/report.h"

namespace kvferry::replay {
namespace {

double ms_between(int64_t from_ns, int64_t to_ns) {
  return from_ns > 0 && to_ns > 0 ? double(to_ns - from_ns) / 1e6 : -1;
}

nlohmann::ordered_json ms_or_null(double ms) {
  return ms < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(double(int64_t(ms * 10 + 0.5)) / 10);
}

}  // namespace

std::string ScaleEventFigures::name() const {
  return fmt::format("t={}s {}{} instance {}", rec.t_s, rec.join ? '+' : '-', role_name(rec.role), rec.instance);
}

void add_scale_events(Report& rep, const ReplayResults& results,
                      const std::map<std::pair<Role, uint32_t>, int64_t>& started_ns) {
  rep.scale_events.clear();
  for (const ScaleRecord& r : results.scale) {
    ScaleEventFigures f;
    f.rec = r;
    if (r.join) {
      auto it = started_ns.find({r.role, r.instance});
      const int64_t started = it == started_ns.end() ? 0 : it->second;
      f.ready_ms = ms_between(started, r.ready_ns);
      f.first_room_ms = ms_between(started, r.first_room_ns);
    } else {
      f.drained_ms = ms_between(r.event_ns, r.left_ns);
      // Prefill ranks of every instance name themselves engine 0 to their peers: a prefill
      // instance's ranks are told apart by role only.
      for (const LogScan::PeerDead& d : rep.logs.peer_dead) {
        auto peer = RankId::parse(d.peer);
        if (!d.above_debug || !peer || peer->role != r.role || d.mono_ns < r.event_ns) continue;
        if (r.role == Role::kDecode && peer->engine_id != r.instance) continue;
        ++f.peer_dead_lines;
      }
    }
    rep.scale_events.push_back(f);
  }
}

void scale_problems(const Report& rep, std::vector<std::string>& p) {
  for (const ScaleEventFigures& f : rep.scale_events) {
    if (f.rec.join && f.rec.ready_ns == 0) p.push_back(f.name() + ": never ready");
    if (!f.rec.join && f.rec.left_ns == 0) p.push_back(f.name() + ": did not leave");
    if (!f.rec.join && f.rec.rooms > 0)
      p.push_back(fmt::format("{}: {} requests dispatched to it after its event", f.name(), f.rec.rooms));
    if (f.rec.failed_rooms_caused > 0)
      p.push_back(fmt::format("{}: {} failed rooms caused by it", f.name(), f.rec.failed_rooms_caused));
    if (f.peer_dead_lines > 0)
      p.push_back(fmt::format("{}: {} peer_dead lines above debug about its ranks", f.name(), f.peer_dead_lines));
  }
}

std::string scale_events_json(const Report& rep) {
  auto arr = nlohmann::ordered_json::array();
  for (const ScaleEventFigures& f : rep.scale_events) {
    const ScaleRecord& r = f.rec;
    arr.push_back({{"t_s", r.t_s},
                   {"action", r.join ? "join" : "leave"},
                   {"role", std::string(role_name(r.role))},
                   {"instance", r.instance},
                   {"ready_ms", ms_or_null(f.ready_ms)},
                   {"first_room_ms", ms_or_null(f.first_room_ms)},
                   {"rooms", r.rooms},
                   {"in_flight_at_event", r.join ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.in_flight_at_event)},
                   {"drained_ms", ms_or_null(f.drained_ms)},
                   {"failed_rooms_caused", r.failed_rooms_caused},
                   {"peer_dead_lines", f.peer_dead_lines}});
  }
  return arr.dump();
}

std::string scale_events_text(const Report& rep) {
  std::string s;
  for (const ScaleEventFigures& f : rep.scale_events) {
    if (f.rec.join) {
      s += fmt::format("  {}: ready {:.0f} ms after its start, first room at {:.0f} ms, {} rooms, {} failed by it\n",
                       f.name(), f.ready_ms, f.first_room_ms, f.rec.rooms, f.rec.failed_rooms_caused);
    } else {
      s += fmt::format("  {}: {} requests in flight at the event, left {:.0f} ms after it, {} rooms after it, "
                       "{} failed by it\n",
                       f.name(), f.rec.in_flight_at_event, f.drained_ms, f.rec.rooms, f.rec.failed_rooms_caused);
    }
  }
  return s;
}

}  // namespace kvferry::replay
