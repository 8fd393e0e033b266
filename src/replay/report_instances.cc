// Per-instance figures of an xPyD replay (report.h add_instance_figures(), docs/report.md
// "Instances").
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "replay/report.h"

namespace kvferry::replay {
namespace {

double round3(double v) { return std::round(v * 1000) / 1000; }

}  // namespace

std::string InstanceFigures::name() const { return fmt::format("{} instance {}", role_name(role), instance); }

void add_instance_figures(Report& rep, const ReplayResults& results, uint32_t prefill_instances,
                          uint32_t decode_instances) {
  rep.instances.clear();
  if (prefill_instances <= 1 && decode_instances <= 1) return;
  const uint32_t n[2] = {std::max<uint32_t>(1, prefill_instances), std::max<uint32_t>(1, decode_instances)};
  std::vector<InstanceFigures> figs[2];
  std::vector<std::vector<double>> lat[2];
  for (size_t r = 0; r < 2; ++r) {
    figs[r].resize(n[r]);
    lat[r].resize(n[r]);
    for (uint32_t i = 0; i < n[r]; ++i) {
      figs[r][i].role = r == 0 ? Role::kPrefill : Role::kDecode;
      figs[r][i].instance = i;
      figs[r][i].rooms_by_peer_instance.assign(n[1 - r], 0);
    }
  }
  std::map<std::string, const RequestOutcome*> by_room;
  for (const RequestOutcome& q : results.requests) {
    by_room[std::to_string(q.room)] = &q;
    if (q.dispatched_ns == 0 || q.prefill_instance >= n[0] || q.decode_instance >= n[1]) continue;
    InstanceFigures* at[2] = {&figs[0][q.prefill_instance], &figs[1][q.decode_instance]};
    const bool rejected = q.decode && q.decode->rejected;
    const bool ok = !rejected && q.router_failure.empty() && q.prefill && q.decode &&
                    q.prefill->state == KVPoll::Success && q.decode->state == KVPoll::Success;
    ++at[0]->rooms_by_peer_instance[q.decode_instance];
    ++at[1]->rooms_by_peer_instance[q.prefill_instance];
    for (size_t r = 0; r < 2; ++r) {
      ++at[r]->rooms;
      (rejected ? at[r]->rejected : ok ? at[r]->succeeded : at[r]->failed) += 1;
    }
    if (q.prefill) at[0]->bytes += q.prefill->bytes_transferred;
    if (q.decode) {
      at[1]->bytes += q.decode->bytes_verified;
      at[1]->bytes_mismatched += q.decode->bytes_mismatched;
    }
    if (ok && q.prefill->first_send_ns > 0 && q.decode->success_ns >= q.prefill->first_send_ns) {
      const double ms = double(q.decode->success_ns - q.prefill->first_send_ns) / 1e6;
      lat[0][q.prefill_instance].push_back(ms);
      lat[1][q.decode_instance].push_back(ms);
    }
  }
  for (const FaultEntry& f : rep.faults) {
    auto it = by_room.find(f.room);
    auto at = RankId::parse(f.injected_at);
    if (it == by_room.end() || !at) continue;
    const size_t r = at->role == Role::kPrefill ? 0 : 1;
    const uint32_t i = r == 0 ? it->second->prefill_instance : it->second->decode_instance;
    if (i >= n[r]) continue;
    ++figs[r][i].faults;
    figs[r][i].faults_attributed += f.attributed() ? 1 : 0;
  }
  for (size_t r = 0; r < 2; ++r) {
    for (uint32_t i = 0; i < n[r]; ++i) {
      InstanceFigures& f = figs[r][i];
      f.transfer_latency_ms = percentiles(std::move(lat[r][i]));
      if (rep.transfer_seconds > 0) f.gb_per_s = double(f.bytes) / rep.transfer_seconds / 1e9;
      rep.instances.push_back(f);
    }
  }
}

std::string instances_json(const Report& rep) {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const InstanceFigures& f : rep.instances) {
    nlohmann::ordered_json o = {{"role", std::string(role_name(f.role))},
                                {"instance", f.instance},
                                {"rooms", f.rooms},
                                {"rooms_by_peer_instance", f.rooms_by_peer_instance},
                                {"succeeded", f.succeeded},
                                {"failed", f.failed},
                                {"rejected", f.rejected},
                                {f.role == Role::kPrefill ? "bytes_transferred" : "bytes_verified", f.bytes}};
    if (f.role == Role::kDecode) o["bytes_mismatched"] = f.bytes_mismatched;
    o["gb_per_s"] = std::round(f.gb_per_s * 1e4) / 1e4;
    o["transfer_latency_ms"] = {{"p50", round3(f.transfer_latency_ms.p50)},
                                {"p99", round3(f.transfer_latency_ms.p99)},
                                {"count", f.transfer_latency_ms.count}};
    o["faults"] = f.faults;
    o["faults_attributed"] = f.faults_attributed;
    arr.push_back(std::move(o));
  }
  return arr.dump();
}

std::string instances_text(const Report& rep) {
  std::string s;
  for (const InstanceFigures& f : rep.instances) {
    s += fmt::format("  {}: {} rooms, {} ok, {} failed, {} rejected, {:.3f} GB ({:.3f} GB/s), "
                     "latency p50 {:.1f} ms p99 {:.1f} ms, faults {}/{} attributed\n",
                     f.name(), f.rooms, f.succeeded, f.failed, f.rejected, double(f.bytes) / 1e9, f.gb_per_s,
                     f.transfer_latency_ms.p50, f.transfer_latency_ms.p99, f.faults_attributed, f.faults);
  }
  return s;
}

}  // namespace kvferry::replay
