// The report's checks of network faults (report.h NetFaultEntry; docs/report.md "Network
// faults", docs/failure-model.md "Network faults"): link_down and partition of one host
// (fault_plan.h), as the orchestrator carried them out (net_fault_executor.h).
//   - every affected room that failed did so with peer_unreachable, and the engines off the host
//     name a rank of the host as origin (an engine on the host may name either side: it saw the
//     other side go silent, or was told the other side's verdict after the heal); such rooms are
//     the fault's, not unexpected failures;
//   - shorter than the heartbeat timeout: that is all that may happen, and rooms after the link
//     is back succeed (nobody stays blacklisted);
//   - longer than the detection bound (a cut network: PeerMonitor::kUnreachableFactor x the
//     timeout; a stopped rank: kHungFactor x): every rank of the host is declared dead by an
//     engine off the host, no room in flight at the start survives the timeout; in between, a
//     heal may come before the verdict;
//   - always: no (detecting engine, dead peer) pair logs more than one peer_dead line above
//     debug, and rooms after the heal succeed without any restart.
#include <algorithm>
#include <climits>
#include <cmath>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "endpoint/peer_monitor.h"
#include "replay/report.h"

namespace kvferry::replay {
namespace {

using json = nlohmann::ordered_json;

bool succeeded(const RequestOutcome& q) {
  return q.router_failure.empty() && q.prefill && q.decode && !q.decode->rejected &&
         q.prefill->state == KVPoll::Success && q.decode->state == KVPoll::Success;
}

bool rejected(const RequestOutcome& q) { return q.decode && q.decode->rejected; }

std::string engine_of(const std::string& rank) {
  auto r = RankId::parse(rank);
  return r ? std::string(role_name(r->role)) : rank;
}

// The ranks cut off by a fault: those on its host, or a pause's rank alone (its "host").
struct Sides {
  Sides(const std::map<std::string, std::string>& rank_host, const NetFaultRecord& f) {
    if (f.kind == "pause") {
      cut_ranks.insert(f.host);
      return;
    }
    for (const auto& [rank, h] : rank_host)
      if (h == f.host) cut_ranks.insert(rank);
  }
  std::set<std::string> cut_ranks;
  // Whether `rank` is cut off (unknown ranks: no).
  bool cut(const std::string& rank) const { return cut_ranks.count(rank) != 0; }
  // Whether a rank of `role`'s engine is cut off.
  bool engine_any(Role role) const {
    for (const auto& rank : cut_ranks)
      if (engine_of(rank) == role_name(role)) return true;
    return false;
  }
  // Whether an engine's peer_unreachable failure with `origin` is the cut's: an engine wholly off
  // the host names a rank of the host; an engine with ranks on the host names a rank across the
  // cut (it saw that side go silent) or one of the host (the verdict of the other side, told
  // after the heal), so any rank.
  bool attributed(Role role, const std::string& origin) const {
    if (engine_any(role)) return RankId::parse(origin).has_value();
    return cut(origin);
  }
};

// The time a room's engines concluded (the last one's), 0 if one has no result.
int64_t failed_all_ns(const RequestOutcome& q) {
  int64_t t = 0;
  for (const auto* r : {&q.prefill, &q.decode}) {
    if (!*r || (*r)->state != KVPoll::Failed) continue;
    t = std::max(t, (*r)->failed_all_ns);
  }
  return t;
}

int64_t first_failed_ns(const RequestOutcome& q) {
  int64_t t = 0;
  for (const auto* r : {&q.prefill, &q.decode}) {
    if (*r && (*r)->state == KVPoll::Failed && (*r)->first_failed_ns > 0 && (t == 0 || (*r)->first_failed_ns < t))
      t = (*r)->first_failed_ns;
  }
  return t;
}

}  // namespace

void add_net_fault_checks(Report& rep, const ReplayResults& results, const std::vector<NetFaultRecord>& faults,
                          const std::map<std::string, std::string>& rank_host, int64_t heartbeat_timeout_ms) {
  const int64_t timeout_ns = heartbeat_timeout_ms * 1'000'000;
  // Detection may take PeerMonitor::kHungFactor (4) x the timeout for a peer whose socket still
  // accepts; then the engines tell each other: the settle time after the heal.
  const int64_t settle_ns = 4 * timeout_ns + 2'000'000'000;
  std::set<std::string> explained_rooms;
  std::vector<std::pair<int64_t, int64_t>> windows;  // [start, heal + settle] of each fault
  for (const NetFaultRecord& f : faults) {
    NetFaultEntry e;
    e.record = f;
    e.beyond_timeout = f.ms > heartbeat_timeout_ms;
    e.detection_bound_ms =
        (f.kind == "pause" ? PeerMonitor::kHungFactor : PeerMonitor::kUnreachableFactor) * heartbeat_timeout_ms;
    e.must_detect = f.ms > e.detection_bound_ms;
    if (f.start_ns == 0) {
      rep.net_faults.push_back(std::move(e));
      continue;
    }
    const int64_t end = f.end_ns != 0 ? f.end_ns : INT64_MAX / 2;
    windows.emplace_back(f.start_ns, end + settle_ns);
    const Sides sides(rank_host, f);
    // Until the cluster is whole again (the first room dispatched after the heal that succeeds),
    // rooms failing across the cut are the fault's: e.g. a paused rank's engine fails what it gets
    // until that rank is back in it.
    int64_t back_dispatch = 0;
    if (f.end_ns != 0)
      for (const auto& q : results.requests)
        if (succeeded(q) && q.dispatched_ns >= f.end_ns && (back_dispatch == 0 || q.dispatched_ns < back_dispatch))
          back_dispatch = q.dispatched_ns;
    const int64_t explain_until = std::max(end, back_dispatch);
    const bool involved = !sides.cut_ranks.empty();
    std::vector<double> to_failed;
    for (const auto& q : results.requests) {
      if (!involved || q.dispatched_ns == 0 || q.dispatched_ns >= explain_until || rejected(q)) continue;
      const bool ok = succeeded(q);
      if (ok && q.decode->success_ns < f.start_ns) continue;
      if (!ok && first_failed_ns(q) != 0 && first_failed_ns(q) < f.start_ns) continue;
      ++e.rooms_affected;
      if (ok) {
        if (q.dispatched_ns < f.start_ns && q.decode->success_ns > f.start_ns + timeout_ns) ++e.rooms_survived;
        continue;
      }
      if (q.fault) continue;  // an injected room fault is the fault plan's (report.cc)
      bool across = q.router_failure.empty() && q.prefill && q.decode;
      for (const auto* r : {&q.prefill, &q.decode}) {
        if (!*r || (*r)->state != KVPoll::Failed) continue;
        across &= (*r)->code == ErrorCode::kPeerUnreachable && sides.attributed((*r)->role, (*r)->origin);
      }
      if (!across) {
        if (e.rooms_misattributed++ < 3) e.misattributed_examples.push_back(!q.error.empty() ? q.error : final_error(q));
        continue;
      }
      ++e.rooms_failed;
      explained_rooms.insert(std::to_string(q.room));
      const int64_t from = std::max(f.start_ns, q.dispatched_ns);
      if (const int64_t all = failed_all_ns(q); all >= from) to_failed.push_back(double(all - from) / 1e6);
    }
    e.to_all_failed_ms = percentiles(std::move(to_failed));
    // peer_dead lines between the sides, per (detecting engine, dead peer).
    std::map<std::pair<std::string, std::string>, uint64_t> pairs;
    for (const auto& l : rep.logs.peer_dead) {
      if (!l.above_debug || l.mono_ns < f.start_ns || l.mono_ns > end + settle_ns) continue;
      if (sides.cut(l.rank) == sides.cut(l.peer)) {
        e.same_side_lines.push_back(l.describe());
        continue;
      }
      ++e.peer_dead_lines;
      ++pairs[{engine_of(l.rank), l.peer}];
    }
    for (const auto& [pair, n] : pairs) {
      if (n > 1) e.repeated_detections.push_back(fmt::format("{} engine declared {} dead {} times", pair.first, pair.second, n));
    }
    if (e.must_detect) {
      for (const auto& rank : sides.cut_ranks) {
        const bool seen = std::any_of(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first.second == rank; });
        if (!seen) e.undetected.push_back(rank);
      }
    }
    // After the heal.
    if (f.end_ns != 0) {
      int64_t first_ok = 0;
      for (const auto& q : results.requests) {
        if (!succeeded(q) || q.decode->success_ns <= f.end_ns) continue;
        if (first_ok == 0 || q.decode->success_ns < first_ok) first_ok = q.decode->success_ns;
      }
      if (first_ok != 0) e.first_success_after_ms = double(first_ok - f.end_ns) / 1e6;
      for (const auto& q : results.requests) {
        if (q.dispatched_ns < f.end_ns || rejected(q)) continue;
        ++e.rooms_after;
        if (back_dispatch != 0 && q.dispatched_ns > back_dispatch && !succeeded(q) && !q.fault) ++e.rooms_after_failed;
      }
    }
    rep.net_faults.push_back(std::move(e));
  }
  // What the faults explain is not unexpected.
  std::erase_if(rep.unexpected_failures, [&](const FailureEntry& u) { return explained_rooms.count(u.room) != 0; });
  std::vector<std::string> unexplained;
  std::vector<Sides> sides_of;
  for (const NetFaultRecord& f : faults) sides_of.emplace_back(rank_host, f);
  for (const auto& l : rep.logs.peer_dead) {
    if (!l.above_debug) continue;
    const bool death = std::any_of(rep.peer_deaths.begin(), rep.peer_deaths.end(), [&](const PeerDeathEntry& d) {
      return d.record.rank == l.peer && l.mono_ns >= d.record.killed_ns;
    });
    bool in_fault = false;
    for (size_t i = 0; i < faults.size() && !in_fault; ++i) {
      if (faults[i].start_ns == 0) continue;
      const Sides& sides = sides_of[i];
      const int64_t end = (faults[i].end_ns != 0 ? faults[i].end_ns : INT64_MAX / 2) + settle_ns;
      in_fault = l.mono_ns >= faults[i].start_ns && l.mono_ns <= end && sides.cut(l.rank) != sides.cut(l.peer);
    }
    if (!death && !in_fault) unexplained.push_back(l.describe());
  }
  rep.unexplained_peer_dead = std::move(unexplained);
}

void net_fault_problems(const Report& rep, std::vector<std::string>& p) {
  for (const auto& e : rep.net_faults) {
    const NetFaultRecord& f = e.record;
    const std::string name = fmt::format("{} of {} ({} ms)", f.kind, f.host, f.ms);
    if (!f.error.empty()) p.push_back(fmt::format("{}: {}", name, f.error));
    if (f.start_ns == 0) {
      if (f.error.empty()) p.push_back(name + ": never injected (the replay ended before its dispatch count)");
      continue;
    }
    if (e.rooms_misattributed > 0) {
      p.push_back(fmt::format("{}: {} rooms failed otherwise than peer_unreachable across the cut (first: {})", name,
                              e.rooms_misattributed, e.misattributed_examples.front()));
    }
    if (!e.same_side_lines.empty()) {
      p.push_back(fmt::format("{}: {} peer_dead lines above debug between ranks of one side (first: {})", name,
                              e.same_side_lines.size(), e.same_side_lines.front()));
    }
    if (!e.repeated_detections.empty()) {
      p.push_back(fmt::format("{}: more than one peer_dead line above debug per detecting engine per dead peer "
                              "({})",
                              name, e.repeated_detections.front()));
    }
    if (e.must_detect) {
      if (!e.undetected.empty())
        p.push_back(fmt::format("{}: {} was never declared dead by an engine off the host", name, e.undetected.front()));
      if (e.rooms_survived > 0)
        p.push_back(fmt::format("{}: {} rooms in flight at the start succeeded past the heartbeat timeout", name,
                                e.rooms_survived));
    }
    if (e.rooms_after_failed > 0) {
      p.push_back(fmt::format("{}: {} of {} rooms dispatched after the heal failed after one succeeded", name,
                              e.rooms_after_failed, e.rooms_after));
    }
    if (e.rooms_after > 0 && e.first_success_after_ms < 0)
      p.push_back(fmt::format("{}: no room succeeded after the heal", name));
  }
}

std::string net_faults_json(const Report& rep) {
  auto ms = [](double v) { return std::round(v * 1000.0) / 1000.0; };
  json a = json::array();
  for (const auto& e : rep.net_faults) {
    const NetFaultRecord& f = e.record;
    const Percentiles& t = e.to_all_failed_ms;
    a.push_back({{"kind", f.kind},
                 {"host", f.host},
                 {"ms", f.ms},
                 {"links", f.links},
                 {"start_mono_ns", f.start_ns},
                 {"end_mono_ns", f.end_ns},
                 {"held_ms", f.start_ns != 0 && f.end_ns != 0 ? ms(double(f.end_ns - f.start_ns) / 1e6) : 0.0},
                 {"error", f.error},
                 {"beyond_heartbeat_timeout", e.beyond_timeout},
                 {"detection_bound_ms", e.detection_bound_ms},
                 {"must_be_detected", e.must_detect},
                 {"rooms_affected", e.rooms_affected},
                 {"rooms_failed", e.rooms_failed},
                 {"rooms_misattributed", e.rooms_misattributed},
                 {"misattributed_examples", e.misattributed_examples},
                 {"rooms_survived", e.rooms_survived},
                 {"start_to_all_failed_ms",
                  {{"p50", ms(t.p50)}, {"p99", ms(t.p99)}, {"max", ms(t.max)}, {"count", t.count}}},
                 {"peer_dead_lines", e.peer_dead_lines},
                 {"repeated_detections", e.repeated_detections},
                 {"same_side_lines", e.same_side_lines},
                 {"undetected", e.undetected},
                 {"rooms_after_heal", e.rooms_after},
                 {"rooms_after_heal_failed", e.rooms_after_failed},
                 {"first_success_after_heal_ms", ms(e.first_success_after_ms)}});
  }
  return a.dump();
}

std::string net_faults_text(const Report& rep) {
  std::string s;
  for (const auto& e : rep.net_faults) {
    const NetFaultRecord& f = e.record;
    if (f.start_ns == 0) {
      s += fmt::format("{} of {} ({} ms): not injected{}\n", f.kind, f.host, f.ms, f.error.empty() ? "" : ": " + f.error);
      continue;
    }
    s += fmt::format("{} of {} for {} ms: {} rooms affected, {} failed across the cut (all ranks Failed after p50 "
                     "{:.0f} ms, p99 {:.0f} ms from the start), {} misattributed, {} peer_dead lines; first success "
                     "{:.0f} ms after the heal\n",
                     f.kind, f.host, f.ms, e.rooms_affected, e.rooms_failed, e.to_all_failed_ms.p50,
                     e.to_all_failed_ms.p99, e.rooms_misattributed, e.peer_dead_lines, e.first_success_after_ms);
  }
  return s;
}

}  // namespace kvferry::replay
