// The report's checks of restarts (report.h add_restart_checks): a rank killed and started again,
// on the same ports for restart@RANK (fault_plan.h), is found again and serves new rooms; what
// was meant for its previous incarnation is refused (kvferry/messages.h) and counted.
#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "replay/report.h"

namespace kvferry::replay {
namespace {

bool succeeded(const RequestOutcome& q) {
  return q.router_failure.empty() && q.prefill && q.decode && !q.decode->rejected &&
         q.prefill->state == KVPoll::Success && q.decode->state == KVPoll::Success;
}

bool rejected(const RequestOutcome& q) { return q.decode && q.decode->rejected; }

}  // namespace

void add_restart_checks(Report& rep, const ReplayResults& results, const LogScan& logs) {
  for (auto& e : rep.peer_deaths) {
    const PeerDeathRecord& d = e.record;
    int64_t until = INT64_MAX;  // the next kill of the same rank
    for (const auto& o : rep.peer_deaths) {
      if (o.record.rank == d.rank && o.record.killed_ns > d.killed_ns) until = std::min(until, o.record.killed_ns);
    }
    for (const auto& s : logs.stale_refused) e.stale_refused += s.mono_ns >= d.killed_ns && s.mono_ns < until;
    if (!d.restarted) continue;
    // The rank is back once a room dispatched after its restart succeeded; every room dispatched
    // after that one must succeed too (rooms in between may still meet the previous incarnation).
    int64_t first_ok_ns = 0, back_dispatch_ns = 0;
    for (const auto& q : results.requests) {
      if (q.dispatched_ns < d.restarted_ns || q.dispatched_ns >= until || !succeeded(q)) continue;
      if (first_ok_ns == 0 || q.decode->success_ns < first_ok_ns) first_ok_ns = q.decode->success_ns;
      if (back_dispatch_ns == 0 || q.dispatched_ns < back_dispatch_ns) back_dispatch_ns = q.dispatched_ns;
    }
    for (const auto& q : results.requests) {
      if (q.dispatched_ns < d.restarted_ns || q.dispatched_ns >= until || rejected(q)) continue;
      ++e.rooms_after_restart;
      // An injected room fault is the fault's, not the restart's.
      if (back_dispatch_ns > 0 && q.dispatched_ns > back_dispatch_ns && !succeeded(q) && !q.fault)
        ++e.rooms_after_restart_failed;
    }
    if (first_ok_ns > 0) e.first_success_after_restart_ms = double(first_ok_ns - d.restarted_ns) / 1e6;
  }
}

void restart_problems(const Report& rep, std::vector<std::string>& p) {
  for (const auto& d : rep.peer_deaths) {
    if (!d.record.same_ports || !d.record.restarted) continue;
    if (d.rooms_after_restart_failed > 0) {
      p.push_back(fmt::format("restart of {} on the same ports: {} of {} rooms dispatched after it failed",
                              d.record.rank, d.rooms_after_restart_failed, d.rooms_after_restart));
    }
    if (d.rooms_after_restart > 0 && d.first_success_after_restart_ms < 0) {
      p.push_back(fmt::format("restart of {} on the same ports: no room dispatched after it succeeded",
                              d.record.rank));
    }
  }
}

}  // namespace kvferry::replay
