// Report building (report.h): classification of every request, fault and peer-death
// attribution, percentiles, and the problems that make a replay unclean. The JSON and summary
// writing is report_json.cc.
// Thread contract: pure functions.
#include "replay/report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "replay/fault_plan.h"

namespace kvferry::replay {

std::string instance_origin(const std::string& origin, const RequestOutcome& q) {
  auto r = RankId::parse(origin);
  if (!r || r->role != Role::kPrefill || r->engine_id != 0 || q.prefill_instance == 0) return origin;
  r->engine_id = q.prefill_instance;
  return r->str();
}

namespace {

std::string origin_of(const RequestOutcome& q) {
  const bool pf = q.prefill && q.prefill->state == KVPoll::Failed;
  const bool df = q.decode && q.decode->state == KVPoll::Failed;
  const std::string po = pf ? instance_origin(q.prefill->origin, q) : "";
  const std::string dp = df ? instance_origin(q.decode->origin, q) : "";
  if (df && pf && !po.empty() && !dp.empty() && po != dp) {
    return "prefill says " + po + ", decode says " + dp;
  }
  if (df && !dp.empty()) return dp;
  if (pf && !po.empty()) return po;
  if (!q.router_failure.empty()) return "router";
  return "unknown";
}

// The failure's code and reason as the engines report it (decode first: it is the request's end).
const RoomResult* failed_result(const RequestOutcome& q) {
  if (q.decode && q.decode->state == KVPoll::Failed) return &*q.decode;
  if (q.prefill && q.prefill->state == KVPoll::Failed) return &*q.prefill;
  return nullptr;
}

double time_to_all_failed_ms(const RequestOutcome& q) {
  int64_t first = 0;
  int64_t all = 0;
  for (const auto* r : {&q.prefill, &q.decode}) {
    if (!*r || (*r)->state != KVPoll::Failed) continue;
    if ((*r)->first_failed_ns > 0 && (first == 0 || (*r)->first_failed_ns < first)) {
      first = (*r)->first_failed_ns;
    }
    all = std::max(all, (*r)->failed_all_ns);
  }
  if (first == 0 || all < first) return 0;
  return double(all - first) / 1e6;
}

}  // namespace

Percentiles percentiles(std::vector<double> values) {
  Percentiles p;
  p.count = values.size();
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  auto at = [&](double q) {
    const double rank = std::ceil(q / 100.0 * double(values.size()));
    const size_t idx = rank < 1 ? 0 : std::min(values.size() - 1, size_t(rank) - 1);
    return values[idx];
  };
  p.p50 = at(50);
  p.p90 = at(90);
  p.p99 = at(99);
  p.max = values.back();
  return p;
}

uint64_t Report::faults_misattributed() const {
  return uint64_t(std::count_if(faults.begin(), faults.end(),
                                [](const FaultEntry& f) { return !f.attributed(); }));
}

uint64_t Report::faults_not_one_line() const {
  return uint64_t(std::count_if(faults.begin(), faults.end(),
                                [](const FaultEntry& f) { return f.lines_above_debug != 1; }));
}

std::vector<std::string> Report::problems() const {
  std::vector<std::string> p;
  if (bytes_mismatched > 0) p.push_back(fmt::format("{} mismatched bytes", bytes_mismatched));
  if (succeeded > 0 && bytes_verified == 0) p.push_back("no byte was verified");
  if (uint64_t n = faults_misattributed()) {
    const auto& f = *std::find_if(faults.begin(), faults.end(),
                                  [](const FaultEntry& e) { return !e.attributed(); });
    p.push_back(fmt::format("{} faults misattributed (first: room {} injected at {}, observed {})",
                            n, f.room, f.injected_at, f.observed_origin));
  }
  if (uint64_t n = faults_not_one_line()) {
    const auto& f = *std::find_if(faults.begin(), faults.end(),
                                  [](const FaultEntry& e) { return e.lines_above_debug != 1; });
    p.push_back(fmt::format("{} faults without exactly one log line above debug (first: room {} "
                            "has {})",
                            n, f.room, f.lines_above_debug));
  }
  {
    uint64_t n = 0;
    const FaultEntry* first = nullptr;
    for (const auto& f : faults)
      if (f.ranks_total > 0 && f.ranks_unaccounted() > 0 && n++ == 0) first = &f;
    if (first) {
      p.push_back(fmt::format("{} faults left ranks neither Failed nor concluded (first: room {}, {} of {} "
                              "ranks)",
                              n, first->room, first->ranks_unaccounted(), first->ranks_total));
    }
  }
  if (!unexpected_failures.empty()) {
    const auto& u = unexpected_failures.front();
    p.push_back(fmt::format("{} unexpected failures (first: room {} {} at {}: {})",
                            unexpected_failures.size(), u.room, u.code, u.origin, u.reason));
  }
  if (logs.invalid_lines > 0) {
    p.push_back(fmt::format("{} invalid log lines (first: {})", logs.invalid_lines,
                            logs.first_invalid));
  }
  if (logs.lines == 0) p.push_back("no log lines found");
  for (const auto& d : peer_deaths) {
    for (const auto& engine : d.expected_engines) {
      if (std::none_of(d.detections.begin(), d.detections.end(),
                       [&](const PeerDeathEntry::Detection& x) { return x.engine == engine; })) {
        p.push_back(fmt::format("peer death of {}: the {} engine logged no peer_dead line above debug",
                                d.record.rank, engine));
      }
    }
    if (d.rooms_with_lines > 0) {
      p.push_back(fmt::format("peer death of {}: {} of its rooms logged a line above debug (first: "
                              "room {})",
                              d.record.rank, d.rooms_with_lines, d.first_room_with_lines));
    }
    if (d.lines_above_debug != d.expected_engines.size()) {
      p.push_back(fmt::format("peer death of {}: {} peer_dead lines above debug, expected {} (one "
                              "per detecting engine)",
                              d.record.rank, d.lines_above_debug, d.expected_engines.size()));
    }
  }
  if (!unexplained_peer_dead.empty()) {
    p.push_back(fmt::format("{} peer_dead lines above debug for a rank that was not killed (first: {})",
                            unexplained_peer_dead.size(), unexplained_peer_dead.front()));
  }
  restart_problems(*this, p);
  net_fault_problems(*this, p);
  scale_problems(*this, p);
  p.insert(p.end(), process_problems.begin(), process_problems.end());
  return p;
}

namespace {

// Failure time of a failed request: its earliest first_failed_ns, else its dispatch time.
int64_t failure_time_ns(const RequestOutcome& q) {
  int64_t t = 0;
  for (const auto* r : {&q.prefill, &q.decode}) {
    if (*r && (*r)->state == KVPoll::Failed && (*r)->first_failed_ns > 0 &&
        (t == 0 || (*r)->first_failed_ns < t)) {
      t = (*r)->first_failed_ns;
    }
  }
  return t > 0 ? t : q.dispatched_ns;
}

// The peer death a failed request is attributed to (index into `deaths`), or -1: every failed
// result names the killed rank as origin with code peer_unreachable. The same rank killed twice:
// the latest kill before the failure.
int death_of(const RequestOutcome& q, const std::vector<PeerDeathRecord>& deaths) {
  if (!q.router_failure.empty()) return -1;
  std::string rank;
  for (const auto* r : {&q.prefill, &q.decode}) {
    if (!*r || (*r)->state != KVPoll::Failed) continue;
    if ((*r)->code != ErrorCode::kPeerUnreachable || (!rank.empty() && rank != (*r)->origin)) return -1;
    rank = (*r)->origin;
  }
  if (rank.empty()) return -1;
  const int64_t t = failure_time_ns(q);
  int found = -1;
  for (size_t i = 0; i < deaths.size(); ++i) {
    if (deaths[i].rank != rank) continue;
    if (found < 0 || deaths[i].killed_ns <= t + 1'000'000'000) found = int(i);
  }
  return found;
}

// Kill-to-restart window (plus 10 s) of a death, for rooms that failed around it.
bool around(const PeerDeathRecord& d, int64_t t) {
  const int64_t end = (d.restarted ? d.restarted_ns : d.killed_ns) + 10'000'000'000;
  return t >= d.killed_ns && t <= end;
}

void add_detections(PeerDeathEntry& e, const LogScan& logs, const std::vector<PeerDeathRecord>& deaths,
                    uint32_t prefill_tp, uint32_t decode_tp) {
  const PeerDeathRecord& d = e.record;
  int64_t until = INT64_MAX;  // the next kill of the same rank
  for (const auto& o : deaths) {
    if (o.rank == d.rank && o.killed_ns > d.killed_ns) until = std::min(until, o.killed_ns);
  }
  auto dead = RankId::parse(d.rank);
  if (dead) {
    const Role other = dead->role == Role::kPrefill ? Role::kDecode : Role::kPrefill;
    if (d.other_engine_peers) e.expected_engines.emplace_back(role_name(other));
    if ((dead->role == Role::kPrefill ? prefill_tp : decode_tp) > 1) e.expected_engines.emplace_back(role_name(dead->role));
    std::sort(e.expected_engines.begin(), e.expected_engines.end());
  }
  for (const auto& l : logs.peer_dead) {
    if (!l.above_debug || l.peer != d.rank || l.mono_ns < d.killed_ns || l.mono_ns >= until) continue;
    ++e.lines_above_debug;
    auto by = RankId::parse(l.rank);
    const std::string engine = by ? std::string(role_name(by->role)) : l.rank;
    const double ms = double(l.mono_ns - d.killed_ns) / 1e6;
    auto it = std::find_if(e.detections.begin(), e.detections.end(),
                           [&](const PeerDeathEntry::Detection& x) { return x.engine == engine; });
    if (it == e.detections.end()) {
      e.detections.push_back({engine, l.rank, ms});
    } else if (ms < it->ms) {
      *it = {engine, l.rank, ms};
    }
  }
  std::sort(e.detections.begin(), e.detections.end(),
            [](const auto& a, const auto& b) { return a.engine < b.engine; });
}

}  // namespace
Report build_report(const ReplayResults& results, const LogScan& logs,
                    const std::vector<PeerDeathRecord>& deaths, uint32_t prefill_tp,
                    uint32_t decode_tp) {
  Report rep;
  rep.logs = logs;
  rep.total = results.requests.size();
  for (const auto& d : deaths) {
    PeerDeathEntry e;
    e.record = d;
    add_detections(e, logs, deaths, prefill_tp, decode_tp);
    rep.peer_deaths.push_back(std::move(e));
  }
  for (const auto& l : logs.peer_dead) {
    if (!l.above_debug) continue;
    const bool explained = std::any_of(deaths.begin(), deaths.end(), [&](const PeerDeathRecord& d) {
      return d.rank == l.peer && l.mono_ns >= d.killed_ns;
    });
    if (!explained) rep.unexplained_peer_dead.push_back(l.describe());
  }
  std::vector<double> latencies;
  auto lines_for = [&](const std::string& room) -> uint64_t {
    auto it = logs.above_debug_by_room.find(room);
    return it == logs.above_debug_by_room.end() ? 0 : it->second;
  };
  for (const auto& q : results.requests) {
    const std::string room = std::to_string(q.room);
    if (q.prefill) rep.bytes_transferred += q.prefill->bytes_transferred;
    if (q.decode) {
      rep.bytes_verified += q.decode->bytes_verified;
      rep.bytes_mismatched += q.decode->bytes_mismatched;
    }
    const bool rejected = q.decode && q.decode->rejected;
    const bool succeeded = !rejected && q.router_failure.empty() && q.prefill && q.decode &&
                           q.prefill->state == KVPoll::Success &&
                           q.decode->state == KVPoll::Success;
    std::string outcome;
    if (rejected) {
      ++rep.rejected;
      rep.rejected_requests.push_back({room, q.input_tokens, q.decode->reason});
      outcome = "rejected";
    } else if (succeeded) {
      ++rep.succeeded;
      outcome = "succeeded";
      if (q.prefill->first_send_ns > 0 && q.decode->success_ns >= q.prefill->first_send_ns) {
        latencies.push_back(double(q.decode->success_ns - q.prefill->first_send_ns) / 1e6);
      }
      if (q.prefill->compute_end_ns > 0 && q.decode->success_ns > 0)  // the compute model's tail
        rep.transfer_tails.push_back(
            {room, q.input_tokens, double(q.decode->success_ns - q.prefill->compute_end_ns) / 1e6});
    } else {
      ++rep.failed;
      outcome = "failed";
    }
    const RoomResult* fr = failed_result(q);
    const std::string code = fr ? std::string(code_name(fr->code)) : "internal";
    const std::string reason = !q.router_failure.empty() ? q.router_failure
                               : fr                      ? fr->reason
                                                         : "engines disagree on the outcome";
    const std::string error = !q.error.empty() ? q.error : final_error(q);
    const int death = outcome == "failed" ? death_of(q, deaths) : -1;
    if (death >= 0) {
      PeerDeathEntry& e = rep.peer_deaths[size_t(death)];
      ++e.rooms_failed;
      if (lines_for(room) > 0 && e.rooms_with_lines++ == 0) e.first_room_with_lines = room;
    }
    if (q.fault) {
      FaultEntry f;
      f.room = room;
      f.kind = std::string(fault_kind_name(q.fault->kind));
      f.injected_at = instance_origin(q.fault->at.str(), q);
      f.expected_code = expected_code(*q.fault);
      f.error = error;
      f.outcome = outcome;
      f.lines_above_debug = lines_for(room);
      if (outcome == "failed") {
        f.observed_origin = origin_of(q);
        f.code = code;
        f.reason = reason;
        f.ranks_failed = (q.prefill ? q.prefill->ranks_failed : 0) +
                         (q.decode ? q.decode->ranks_failed : 0);
        // A request the router gave up on has no verdict to account ranks by (it is misattributed).
        if (q.router_failure.empty()) f.ranks_total = prefill_tp + decode_tp;
        for (const auto* e : {&q.prefill, &q.decode}) {
          if (*e) f.ranks_lost += (*e)->ranks_lost;
          if (!*e || (*e)->state != KVPoll::Success) continue;
          f.concluded_engines.emplace_back(role_name((*e)->role));
          f.ranks_concluded += (*e)->role == Role::kPrefill ? prefill_tp : decode_tp;
        }
        f.time_to_all_failed_ms = time_to_all_failed_ms(q);
      }
      if (outcome == "failed" && death < 0) {
        rep.faults.push_back(std::move(f));
      } else {
        if (rejected) {
          f.code = code;
          f.reason = q.decode->reason;
          f.observed_origin = instance_origin(q.decode->origin, q);
        }
        if (death >= 0) f.outcome = "failed_by_peer_death";
        rep.faults_not_applied.push_back(std::move(f));
      }
    } else if (outcome == "failed" && death < 0) {
      rep.unexpected_failures.push_back({room, origin_of(q), code, reason, error});
      const int64_t t = failure_time_ns(q);
      for (auto& e : rep.peer_deaths) {
        if (!around(e.record, t)) continue;
        ++e.rooms_misattributed;
        if (e.misattributed_examples.size() < 3) e.misattributed_examples.push_back(error);
      }
    }
  }
  rep.transfer_latency_ms = percentiles(std::move(latencies));
  std::vector<double> tails;
  for (const TailEntry& t : rep.transfer_tails) tails.push_back(t.ms);
  rep.transfer_tail_ms = percentiles(std::move(tails));
  add_restart_checks(rep, results, logs);
  if (results.last_result_ns > results.dispatch_start_ns && results.dispatch_start_ns > 0) {
    rep.transfer_seconds = double(results.last_result_ns - results.dispatch_start_ns) / 1e9;
    rep.throughput_gb_per_s = double(rep.bytes_transferred) / rep.transfer_seconds / 1e9;
  }
  return rep;
}

}  // namespace kvferry::replay
