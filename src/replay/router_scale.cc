// The router's side of --scale (router_scale.h).
#include "replay/router_scale.h"

#include <fmt/format.h>

#include "kvferry/log.h"

namespace kvferry::replay {
namespace {
constexpr std::string_view kComponent = "router";
}

RouterScale::RouterScale(std::vector<ScaleEvent> events, EngineInstances& inst) : inst_(inst) {
  for (const ScaleEvent& e : events) {
    Event x;
    x.plan = e;
    x.rec.t_s = e.t_s;
    x.rec.join = e.join;
    x.rec.role = e.role;
    x.rec.instance = e.instance;
    if (e.join && e.instance < inst_.instances(e.role)) inst_.set_live(e.role, e.instance, false);
    ev_.push_back(std::move(x));
  }
}

void RouterScale::start(int64_t dispatch_start_ns) {
  start_ns_ = dispatch_start_ns;
  for (Event& e : ev_) e.rec.event_ns = start_ns_ + static_cast<int64_t>(e.plan.t_s * 1e9);
}

RouterScale::Event* RouterScale::find(Role role, uint32_t instance, bool join) {
  for (Event& e : ev_)
    if (e.plan.role == role && e.plan.instance == instance && e.plan.join == join) return &e;
  return nullptr;
}

const RouterScale::Event* RouterScale::find(Role role, uint32_t instance, bool join) const {
  for (const Event& e : ev_)
    if (e.plan.role == role && e.plan.instance == instance && e.plan.join == join) return &e;
  return nullptr;
}

Status RouterScale::advance(int64_t now, const std::vector<size_t>& inflight,
                            const std::vector<RequestOutcome>& requests,
                            const std::function<Status(const std::string& leader)>& send_leave,
                            double ready_timeout_s, double leave_timeout_s) {
  for (Event& e : ev_) {
    const ScaleEvent& p = e.plan;
    // A leave of an instance that joins waits until it joined (its leaders are known then).
    const Event* join = p.join ? nullptr : find(p.role, p.instance, true);
    if (e.state == State::kPending && now >= e.rec.event_ns && !(join && join->state != State::kDone)) {
      if (p.join) {
        if (e.rec.ready_ns == 0) e.state = State::kWaiting;
      } else {
        inst_.set_live(p.role, p.instance, false);
        for (size_t i : inflight) {
          const RequestOutcome& o = requests[i];
          if ((p.role == Role::kPrefill ? o.prefill_instance : o.decode_instance) == p.instance) e.touched.push_back(i);
        }
        e.rec.in_flight_at_event = inst_.outstanding(p.role, p.instance);
        e.state = State::kDraining;
        log_event(LogLevel::kInfo, kComponent,
                  fmt::format("{}: draining {} instance {} ({} requests in flight)", p.str(), role_name(p.role),
                              p.instance, e.rec.in_flight_at_event));
      }
    }
    if (e.state == State::kWaiting && now - e.rec.event_ns > static_cast<int64_t>(ready_timeout_s * 1e9)) {
      return {ErrorCode::kWaitingTimeout, fmt::format("{}: {} instance {} not ready within {} s of its event",
                                                      p.str(), role_name(p.role), p.instance, ready_timeout_s)};
    }
    if (e.state == State::kDraining && inst_.outstanding(p.role, p.instance) == 0) {
      for (const std::string& leader : inst_.leaders(p.role, p.instance)) {
        if (Status st = send_leave(leader); !st.ok()) {
          return {st.code(), fmt::format("{}: cannot send leave to {}: {}", p.str(), leader, st.message())};
        }
      }
      e.rec.leave_sent_ns = now;
      e.state = State::kLeaving;
      log_event(LogLevel::kInfo, kComponent,
                fmt::format("{}: {} instance {} drained; leave sent", p.str(), role_name(p.role), p.instance));
    }
    if ((e.state == State::kDraining || e.state == State::kLeaving) &&
        now - e.rec.event_ns > static_cast<int64_t>(leave_timeout_s * 1e9)) {
      return {ErrorCode::kWaitingTimeout, fmt::format("{}: {} instance {} did not leave within {} s of its event",
                                                      p.str(), role_name(p.role), p.instance, leave_timeout_s)};
    }
  }
  return Status::Ok();
}

bool RouterScale::on_ready(Role role, uint32_t instance, uint32_t dp_rank) {
  Event* e = find(role, instance, true);
  if (e == nullptr || e->rec.ready_ns != 0 || dp_rank >= inst_.dp(role)) return false;
  e->groups.insert(dp_rank);
  return e->groups.size() == inst_.dp(role);
}

void RouterScale::joined(Role role, uint32_t instance, int64_t now) {
  Event* e = find(role, instance, true);
  if (e == nullptr || e->rec.ready_ns != 0) return;
  e->rec.ready_ns = now;
  e->state = State::kDone;
  inst_.set_live(role, instance, true);
  log_event(LogLevel::kInfo, kComponent,
            fmt::format("{}: {} instance {} joined", e->plan.str(), role_name(role), instance));
}

void RouterScale::on_stats(Role role, uint32_t instance, uint32_t dp_rank, int64_t now) {
  Event* e = find(role, instance, false);
  if (e == nullptr || e->state != State::kLeaving || dp_rank >= inst_.dp(role)) return;
  e->groups.insert(dp_rank);
  if (e->groups.size() < inst_.dp(role)) return;
  e->rec.left_ns = now;
  e->state = State::kDone;
  log_event(LogLevel::kInfo, kComponent,
            fmt::format("{}: {} instance {} left", e->plan.str(), role_name(role), instance));
}

void RouterScale::on_dispatch(size_t index, uint32_t prefill, uint32_t decode, int64_t now) {
  for (Event& e : ev_) {
    if (!e.plan.join && e.state == State::kPending) continue;  // still chosen: before its event
    if ((e.plan.role == Role::kPrefill ? prefill : decode) != e.plan.instance) continue;
    e.touched.push_back(index);
    ++e.rec.rooms;
    if (e.plan.join && e.rec.first_room_ns == 0) e.rec.first_room_ns = now;
  }
}

bool RouterScale::settled() const {
  for (const Event& e : ev_)
    if (e.state != State::kDone) return false;
  return true;
}

bool RouterScale::left(Role role, uint32_t instance) const {
  for (const Event& e : ev_)
    if (!e.plan.join && e.plan.role == role && e.plan.instance == instance && e.state == State::kDone) return true;
  return false;
}

std::vector<ScaleRecord> RouterScale::records(const std::vector<RequestOutcome>& requests) const {
  std::vector<ScaleRecord> out;
  for (const Event& e : ev_) {
    ScaleRecord r = e.rec;
    r.failed_rooms_caused = 0;
    for (size_t i : e.touched)
      if (i < requests.size() && !requests[i].error.empty() && !requests[i].fault) ++r.failed_rooms_caused;
    out.push_back(r);
  }
  return out;
}

}  // namespace kvferry::replay
