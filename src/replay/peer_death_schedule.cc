// The router's peer-death state machine (peer_death_schedule.h).
#include "replay/peer_death_schedule.h"

#include <fmt/format.h>

#include "kvferry/log.h"

namespace kvferry::replay {
namespace {

constexpr std::string_view kComponent = "router";
constexpr int64_t kRejoinSettleNs = 3'000'000'000;  // see router.h (peer deaths, shutdown)

}  // namespace

PeerDeathSchedule::PeerDeathSchedule(std::vector<PlannedPeerDeath> deaths) {
  for (auto& d : deaths) {
    Death x;
    x.rank = *RankId::parse(d.rank);
    x.plan = std::move(d);
    deaths_.push_back(std::move(x));
  }
}

Death* PeerDeathSchedule::current() {
  for (auto& d : deaths_) {
    if (d.state != Death::State::kDone) return &d;
  }
  return nullptr;
}

bool PeerDeathSchedule::kill_due(size_t dispatched, bool busy) {
  Death* d = current();
  return d && d->state == Death::State::kPlanned && dispatched >= d->plan.after_dispatched && busy;
}

bool PeerDeathSchedule::paused() {
  Death* d = current();
  if (!d || d->state == Death::State::kPlanned) return false;
  if (d->leader()) return true;  // until the new leader's "ready" (the router sets kDone)
  return d->state != Death::State::kRestarted || !d->back;
}

bool PeerDeathSchedule::settled(size_t finished, size_t total) {
  Death* d = current();
  if (!d) return true;
  if (d->state == Death::State::kPlanned && finished >= total) {
    // Every request finished before this kill was due (e.g. after an earlier kill): no room
    // could be in flight, so it is skipped.
    log_event(LogLevel::kInfo, kComponent, "peer death of " + d->rank.str() + " skipped: no request left");
    d->state = Death::State::kDone;
    return settled(finished, total);
  }
  if (d->state == Death::State::kRestarted && monotonic_ns() - d->restarted_ns > kRejoinSettleNs) {
    log_event(LogLevel::kDebug, kComponent, d->rank.str() + " presumed back (no request left to prove it)");
    d->state = Death::State::kDone;
    return settled(finished, total);
  }
  return false;
}

Status PeerDeathSchedule::advance(int64_t now, size_t dispatched, bool busy, size_t total,
                                  size_t inflight, double timeout_s,
                                  const std::function<Status(const std::string& frame)>& ask) {
  Death* d = current();
  if (!d) return Status::Ok();
  if (kill_due(dispatched, busy)) {
    Status st = ask(encode_peer_death("kill", d->rank.str(), 0, ""));
    if (!st.ok()) return {st.code(), "cannot ask the orchestrator for a kill: " + st.message()};
    d->state = Death::State::kRequested;
    since_ns_ = now;
    log_event(LogLevel::kInfo, kComponent,
              fmt::format("peer death: asked for {} to be killed after {} of {} requests were "
                          "dispatched ({} in flight)",
                          d->rank.str(), dispatched, total, inflight));
  }
  if (d->state != Death::State::kPlanned && d->state != Death::State::kDone &&
      now - since_ns_ > static_cast<int64_t>(timeout_s * 1e9)) {
    return {ErrorCode::kWaitingTimeout,
            fmt::format("peer death of {}: not back within {} s of the kill request", d->rank.str(),
                        timeout_s)};
  }
  return Status::Ok();
}

void PeerDeathSchedule::on_frame(const PeerDeathFrame& f, size_t dispatched) {
  Death* d = current();
  if (!d || d->rank.str() != f.rank || d->state == Death::State::kPlanned) {
    log_event(LogLevel::kWarning, kComponent, "unexpected '" + f.type + "' frame for " + f.rank);
    return;
  }
  if (f.type == "killed") {
    d->killed_ns = f.time_ns;
    if (d->state == Death::State::kRequested) d->state = Death::State::kKilled;
  } else if (f.type == "restarted") {
    d->restarted_ns = f.time_ns;
    d->proven_after = dispatched;
    if (!d->leader()) d->state = Death::State::kRestarted;
  } else if (f.type == "kill_failed") {
    log_event(LogLevel::kWarning, kComponent, "peer death of " + f.rank + " failed: " + f.reason);
    d->state = Death::State::kDone;
  }
  log_event(LogLevel::kDebug, kComponent, "peer death: " + f.rank + " " + f.type);
}

void PeerDeathSchedule::on_rank_up(const RankId& rank) {
  Death* d = current();
  if (!d || d->leader() || d->rank != rank ||
      (d->state != Death::State::kKilled && d->state != Death::State::kRestarted)) {
    log_event(LogLevel::kDebug, kComponent, rank.str() + " rejoined its engine (no kill waits for it)");
    return;
  }
  d->back = true;
  log_event(LogLevel::kInfo, kComponent, "peer death: " + rank.str() + " is back in its engine");
}

void PeerDeathSchedule::on_success(size_t i) {
  if (Death* d = current(); d && d->state == Death::State::kRestarted && i >= d->proven_after) {
    d->state = Death::State::kDone;  // a room after the restart succeeded: the rank is back
  }
}

}  // namespace kvferry::replay
