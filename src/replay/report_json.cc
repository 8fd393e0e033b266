// report.json and the summary text (report.h): the Report, the results' leak stats and the
// orchestrator's config as JSON in docs/report.md's field order, and the few human lines
// `kvferry replay` prints at the end.
// Thread contract: pure functions.
#include "replay/report.h"

#include <cmath>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kvferry::replay {
namespace {

using json = nlohmann::ordered_json;  // report fields in a readable order

// Rounds to `digits` decimals (JSON readability; the values are measurements anyway).
double round_to(double v, int digits) {
  const double f = std::pow(10.0, digits);
  return std::round(v * f) / f;
}

json fault_json(const FaultEntry& f, bool applied) {
  json j = {{"room", f.room},
            {"kind", f.kind},
            {"injected_at", f.injected_at},
            {"observed_origin", f.observed_origin},
            {"code", f.code},
            {"reason", f.reason},
            {"expected_code", f.expected_code},
            {"error", f.error},
            {"lines_above_debug", f.lines_above_debug},
            {"ranks_failed", f.ranks_failed},
            {"time_to_all_failed_ms", round_to(f.time_to_all_failed_ms, 3)},
            {"applied", applied}};
  if (applied) {
    j["ranks_total"] = f.ranks_total;
    j["ranks_concluded"] = f.ranks_concluded;
    j["ranks_lost"] = f.ranks_lost;
    j["concluded_engines"] = f.concluded_engines;
  }
  if (!applied) j["outcome"] = f.outcome;
  return j;
}

// "transfer@prefill": the kind and the side it acted on (the code differs by side).
std::string kind_key(const FaultEntry& f) {
  auto r = RankId::parse(f.injected_at);
  return r ? f.kind + "@" + std::string(role_name(r->role)) : f.kind;
}

json failure_json(const FailureEntry& f) {
  return {{"room", f.room}, {"origin", f.origin}, {"code", f.code}, {"reason", f.reason},
          {"error", f.error}};
}

json stats_json(const std::optional<std::vector<RankLeakStats>>& s) {
  if (!s) return nullptr;
  json arr = json::array();
  for (const auto& r : *s) {
    arr.push_back({{"rank", r.rank},
                   {"live_rooms", r.live_rooms},
                   {"records", r.records},
                   {"pages_in_use", r.pages_in_use},
                   {"peers", r.peers},
                   {"quarantined_pages", r.quarantined_pages},  // leaked pages now (decode)
                   {"reclaimed_pages", r.reclaimed_pages}});    // given back after a quarantine
  }
  return arr;
}

json config_object(const std::string& config_json) {
  json c = json::parse(config_json, nullptr, false);
  if (c.is_discarded()) return json::object();
  return c;
}

std::string dump(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string report_json(const Report& r, const ReplayResults& results,
                        const std::string& config_json, double wall_s, const std::string& error) {
  json tails = json::array();
  for (const TailEntry& t : r.transfer_tails)
    tails.push_back({{"room", t.room}, {"input_tokens", t.input_tokens}, {"ms", round_to(t.ms, 3)}});
  json rejected = json::array();
  for (const auto& e : r.rejected_requests) {
    rejected.push_back({{"room", e.room}, {"input_tokens", e.input_tokens}, {"reason", e.reason}});
  }
  json faults = json::array();
  for (const auto& f : r.faults) faults.push_back(fault_json(f, true));
  json not_applied = json::array();
  for (const auto& f : r.faults_not_applied) not_applied.push_back(fault_json(f, false));
  json unexpected = json::array();
  for (const auto& u : r.unexpected_failures) unexpected.push_back(failure_json(u));
  const auto problems = r.problems();
  const uint64_t attributed = r.faults.size() - r.faults_misattributed();
  // Per kind: injected, applied, attributed, lines, time to all-ranks-Failed.
  std::map<std::string, std::vector<const FaultEntry*>> applied_by_kind;
  std::map<std::string, uint64_t> injected_by_kind;
  for (const auto& f : r.faults) {
    applied_by_kind[kind_key(f)].push_back(&f);
    ++injected_by_kind[kind_key(f)];
  }
  for (const auto& f : r.faults_not_applied) ++injected_by_kind[kind_key(f)];
  json by_kind = json::object();
  for (const auto& [kind, injected] : injected_by_kind) {
    const auto& list = applied_by_kind[kind];
    std::vector<double> t;
    uint64_t ok = 0, one_line = 0, concluded = 0;
    for (const FaultEntry* f : list) {
      t.push_back(f->time_to_all_failed_ms);
      ok += f->attributed() ? 1 : 0;
      one_line += f->lines_above_debug == 1 ? 1 : 0;
      concluded += f->concluded_engines.empty() ? 0 : 1;
    }
    const Percentiles pt = percentiles(t);
    by_kind[kind] = {{"injected", injected},
                     {"applied", list.size()},
                     {"attributed", ok},
                     {"exactly_one_line", one_line},
                     {"rooms_with_a_concluded_engine", concluded},
                     {"time_to_all_failed_ms",
                      {{"p50", round_to(pt.p50, 3)},
                       {"p99", round_to(pt.p99, 3)},
                       {"max", round_to(pt.max, 3)},
                       {"count", pt.count}}}};
  }
  json deaths = json::array();
  for (const auto& d : r.peer_deaths) {
    json det = json::array();
    for (const auto& x : d.detections) {
      det.push_back({{"engine", x.engine}, {"rank", x.rank}, {"ms", round_to(x.ms, 3)}});
    }
    deaths.push_back({{"rank", d.record.rank},
                      {"killed_at", round_to(d.record.killed_at_s, 3)},
                      {"killed_mono_ns", d.record.killed_ns},
                      {"restarted_mono_ns", d.record.restarted_ns},
                      {"restarted", d.record.restarted},
                      {"restart_after_ms", d.record.restarted
                                               ? round_to(double(d.record.restarted_ns - d.record.killed_ns) / 1e6, 3)
                                               : 0.0},
                      {"detections", det},
                      {"expected_engines", d.expected_engines},
                      {"lines_above_debug", d.lines_above_debug},
                      {"rooms_failed", d.rooms_failed},
                      {"rooms_misattributed", d.rooms_misattributed},
                      {"rooms_with_lines_above_debug", d.rooms_with_lines},
                      {"misattributed_examples", d.misattributed_examples},
                      {"same_ports", d.record.same_ports},
                      {"rooms_after_restart", d.rooms_after_restart},
                      {"rooms_after_restart_failed", d.rooms_after_restart_failed},
                      {"first_success_after_restart_ms", round_to(d.first_success_after_restart_ms, 3)},
                      {"stale_refused", d.stale_refused}});
  }
  json j = {
      {"status", error.empty() ? "ok" : "failed"},
      {"error", error},
      {"config", config_object(config_json)},
      {"requests",
       {{"total", r.total}, {"succeeded", r.succeeded}, {"failed", r.failed},
        {"rejected", r.rejected}}},
      {"rejected_requests", rejected},
      {"bytes",
       {{"transferred", r.bytes_transferred},
        {"verified", r.bytes_verified},
        {"mismatched", r.bytes_mismatched}}},
      {"throughput_gb_per_s", round_to(r.throughput_gb_per_s, 4)},
      {"transfer_seconds", round_to(r.transfer_seconds, 3)},
      {"transfer_latency_ms",
       {{"p50", round_to(r.transfer_latency_ms.p50, 3)},
        {"p90", round_to(r.transfer_latency_ms.p90, 3)},
        {"p99", round_to(r.transfer_latency_ms.p99, 3)},
        {"max", round_to(r.transfer_latency_ms.max, 3)},
        {"count", r.transfer_latency_ms.count}}},
      {"transfer_tail_ms",  // the prefill compute model (docs/report.md); count 0 without it
       {{"p50", round_to(r.transfer_tail_ms.p50, 3)},
        {"p90", round_to(r.transfer_tail_ms.p90, 3)},
        {"p99", round_to(r.transfer_tail_ms.p99, 3)},
        {"max", round_to(r.transfer_tail_ms.max, 3)},
        {"count", r.transfer_tail_ms.count}}},
      {"transfer_tails", tails},
      {"wall_s", round_to(wall_s, 3)},
      {"faults", faults},
      {"faults_not_applied", not_applied},
      {"faults_summary",
       {{"injected", r.faults.size() + r.faults_not_applied.size()},
        {"applied", r.faults.size()},
        {"attributed", attributed},
        {"misattributed", r.faults_misattributed()},
        {"not_exactly_one_line", r.faults_not_one_line()},
        {"peer_deaths", r.peer_deaths.size()},
        {"by_kind", by_kind}}},
      {"peer_deaths", deaths},
      {"net_faults", json::parse(net_faults_json(r))},
      {"unexplained_peer_dead", r.unexplained_peer_dead},
      {"unexpected_failures", unexpected},
      {"leaks", {{"prefill", stats_json(results.prefill_stats)},
                 {"decode", stats_json(results.decode_stats)}}},
      {"logs",
       {{"files", r.logs.files},
        {"lines", r.logs.lines},
        {"invalid_lines", r.logs.invalid_lines},
        {"first_invalid", r.logs.first_invalid}}},
      {"processes", r.process_exits},
      {"problems", problems},
  };
  if (!r.instances.empty()) j["instances"] = json::parse(instances_json(r));  // xPyD only
  if (!r.scale_events.empty()) j["scale_events"] = json::parse(scale_events_json(r));  // --scale only
  return dump(j);
}

std::string partial_report_json(const std::string& config_json, double wall_s,
                                const std::string& error) {
  json j = {{"status", "failed"},
            {"partial", true},
            {"error", error},
            {"config", config_object(config_json)},
            {"wall_s", round_to(wall_s, 3)}};
  return dump(j);
}

std::string summary_text(const Report& r, double wall_s) {
  std::string s;
  s += fmt::format("requests {}: ok {}, failed {}, rejected {}\n", r.total, r.succeeded, r.failed,
                   r.rejected);
  s += fmt::format("moved {:.2f} GB in {:.1f} s: {:.3f} GB/s (wall {:.1f} s)\n",
                   double(r.bytes_transferred) / 1e9, r.transfer_seconds, r.throughput_gb_per_s,
                   wall_s);
  s += fmt::format("transfer latency p50 {:.1f} ms, p99 {:.1f} ms\n", r.transfer_latency_ms.p50,
                   r.transfer_latency_ms.p99);
  if (!r.instances.empty()) s += "instances:\n" + instances_text(r);
  if (!r.scale_events.empty()) s += "scale events:\n" + scale_events_text(r);
  if (r.transfer_tail_ms.count > 0)
    s += fmt::format("transfer tail (last layer's compute -> decode Success) p50 {:.1f} ms, p99 {:.1f} ms\n",
                     r.transfer_tail_ms.p50, r.transfer_tail_ms.p99);
  s += fmt::format("faults attributed correctly {}/{} ({} not applied)\n",
                   r.faults.size() - r.faults_misattributed(), r.faults.size(),
                   r.faults_not_applied.size());
  std::map<std::string, std::vector<const FaultEntry*>> by_kind;
  for (const auto& f : r.faults) by_kind[kind_key(f)].push_back(&f);
  for (const auto& [kind, list] : by_kind) {
    std::vector<double> t;
    size_t ok = 0;
    for (const FaultEntry* f : list) {
      t.push_back(f->time_to_all_failed_ms);
      ok += f->attributed() ? 1 : 0;
    }
    const Percentiles pt = percentiles(t);
    s += fmt::format("  {}: {}/{} attributed, all ranks Failed after p50 {:.1f} ms, p99 {:.1f} ms\n",
                     kind, ok, list.size(), pt.p50, pt.p99);
  }
  for (const auto& d : r.peer_deaths) {
    std::string det;
    for (const auto& x : d.detections) det += fmt::format(" {} {:.0f} ms,", x.engine, x.ms);
    s += fmt::format("peer death of {} at {:.1f} s ({}): detected by{} {} rooms failed, {} misattributed{}\n",
                     d.record.rank, d.record.killed_at_s, d.record.restarted ? "restarted" : "not restarted",
                     det.empty() ? " nobody," : det, d.rooms_failed, d.rooms_misattributed,
                     d.first_success_after_restart_ms >= 0
                         ? fmt::format("; first success {:.0f} ms after the restart", d.first_success_after_restart_ms)
                         : "");
  }
  s += net_faults_text(r);
  s += fmt::format("bytes verified {}, mismatched {}\n", r.bytes_verified, r.bytes_mismatched);
  return s;
}

}  // namespace kvferry::replay
