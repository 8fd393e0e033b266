// The options of `kvferry replay` (replay_config.h): JSON form, automatic pool size, validation.
#include "replay/replay_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/data_dir.h"
#include "kvferry/geometry.h"
#include "kvferry/trace.h"
#include "kvferry/transport.h"
#include "process/host_memory.h"
#include "process/process.h"

namespace kvferry::replay {
using process::mem_available_bytes;
using process::meminfo_bytes;
using process::self_exe;
namespace {

namespace fs = std::filesystem;

Status invalid(std::string msg) { return {ErrorCode::kInvalidArgument, std::move(msg)}; }

std::string read_file(const std::string& path, bool& ok) {
  std::ifstream in(path, std::ios::binary);
  ok = static_cast<bool>(in);
  std::stringstream ss;
  if (ok) ss << in.rdbuf();
  return ss.str();
}

// --hosts: the file, and that the transport can cross the hosts it places the engines on.
Status validate_hosts(ReplayConfig& c) {
  c.hosts.reset();
  if (c.hosts_file.empty()) return Status::Ok();
  auto hf = load_hosts_file(c.hosts_file, c.prefill_tp, c.prefill_dp, c.decode_tp, c.decode_dp);
  if (!hf.ok()) return hf.status();
  if (c.transport == "shm" && hf->engines_apart()) {
    // UCX would find shared memory between two network namespaces of one machine, but separate
    // machines share none: a placement across hosts must use a network transport.
    std::string where;
    for (uint32_t i = 0; i < hf->place.prefill.size() && where.empty(); ++i) {
      for (uint32_t k = 0; k < hf->place.decode.size() && where.empty(); ++k) {
        if (hf->place.prefill[i] == hf->place.decode[k]) continue;
        where = fmt::format("{} on {} and {} on {}", RankId{Role::kPrefill, 0, i % c.prefill_tp, i / c.prefill_tp}.str(),
                            hf->place.prefill[i], RankId{Role::kDecode, 0, k % c.decode_tp, k / c.decode_tp}.str(),
                            hf->place.decode[k]);
      }
    }
    return invalid("--transport shm needs the prefill and decode ranks on one host, but --hosts " + c.hosts_file +
                   " places " + where + " (separate machines share no memory): use --transport tcp");
  }
  c.hosts = std::move(*hf);
  return Status::Ok();
}

}  // namespace

std::string ReplayConfig::to_json() const {
  nlohmann::ordered_json j = {{"trace", trace},
                      {"model", model},
                      {"models_file", models_file},
                      {"prefill_tp", prefill_tp},
                      {"decode_tp", decode_tp},
                      {"prefill_dp", prefill_dp},
                      {"decode_dp", decode_dp},
                      {"page_size", page_size},
                      {"pool_mib", pool_mib},
                      {"pool_mib_auto", pool_mib_auto},
                      {"prefill_pool_mib", prefill_pool_mib},
                      {"chunk_tokens", chunk_tokens},
                      {"prefill_ms_per_layer", prefill_ms_per_layer},
                      {"layerwise", layerwise},
                      {"max_requests", max_requests},
                      {"time_scale", time_scale},
                      {"fault_rate", fault_rate},
                      {"faults", effective_faults(*this)},
                      {"restart_delay_ms", restart_delay_ms},
                      {"seed", seed},
                      {"transport", transport},
                      {"transfer_shards", transfer_shards},
                      {"integrity", integrity},
                      {"max_inflight", max_inflight},
                      {"out", out},
                      {"ready_timeout_s", ready_timeout_s},
                      {"request_timeout_s", request_timeout_s},
                      {"timeout_s", timeout_s},
                      {"test_break_rank", break_rank},
                      {"metrics", metrics}};
  if (prefill_instances != 1 || decode_instances != 1 || !scale.empty()) {  // xPyD (absent: one of each)
    j["prefill_instances"] = prefill_instances;
    j["decode_instances"] = decode_instances;
  }
  if (!scale.empty()) j["scale"] = scale;
  if (hosts) {  // the placement, as validated ("replay" filled in)
    j["hosts_file"] = hosts_file;
    j["hosts"] = nlohmann::ordered_json::parse(hosts->to_json());
  }
  nlohmann::ordered_json d = nlohmann::ordered_json::object();
  for (const DeadlineField& f : deadline_fields()) {
    std::string key = f.option + 2;  // "--bootstrap-timeout-ms" -> "bootstrap_timeout_ms"
    std::replace(key.begin(), key.end(), '-', '_');
    d[key] = deadlines.*f.member;
  }
  j["deadlines"] = d;
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

uint64_t default_pool_mib(uint64_t mem_available_bytes, uint32_t prefill_tp,
                          uint64_t prefill_pool_mib, uint32_t decode_tp) {  // ranks, not TP
  const uint64_t budget_mib = mem_available_bytes / (1024 * 1024) * 6 / 10;
  const uint64_t staging = uint64_t(prefill_tp) * prefill_pool_mib;
  const uint64_t left = budget_mib > staging ? budget_mib - staging : 0;
  const uint64_t per_rank = left / std::max<uint32_t>(1, decode_tp);
  return std::clamp<uint64_t>(per_rank, 64, 7168);
}

Status validate(ReplayConfig& c) {
  if (c.trace.empty()) return invalid("--trace is required");
  if (c.prefill_tp < 1 || c.prefill_tp > 64) return invalid("--prefill-tp must be in 1..64");
  if (c.decode_tp < 1 || c.decode_tp > 64) return invalid("--decode-tp must be in 1..64");
  if (c.prefill_dp < 1 || c.prefill_dp > 16) return invalid("--prefill-dp must be in 1..16");
  if (c.decode_dp < 1 || c.decode_dp > 16) return invalid("--decode-dp must be in 1..16");
  if (c.prefill_instances < 1 || c.prefill_instances > 16) return invalid("--prefill-instances must be in 1..16");
  if (c.decode_instances < 1 || c.decode_instances > 16) return invalid("--decode-instances must be in 1..16");
  {
    auto events = parse_scale(c.scale, c.prefill_instances, c.decode_instances);
    if (!events.ok()) return invalid(events.status().message());
    c.scale_events = std::move(*events);
  }
  if (!c.scale_events.empty() && c.metrics) {
    return invalid("--scale cannot be given with --metrics (metrics.json names the ranks there from the start)");
  }
  const uint32_t all_prefill = instances_in_all(c, Role::kPrefill), all_decode = instances_in_all(c, Role::kDecode);
  const bool xpyd = all_prefill > 1 || all_decode > 1;
  const uint32_t prefill_ranks = c.prefill_tp * c.prefill_dp * all_prefill;
  const uint32_t decode_ranks = c.decode_tp * c.decode_dp * all_decode;
  if (c.page_size == 0) return invalid("--page-size must be > 0 tokens");
  if (c.chunk_tokens == 0) return invalid("--chunk-tokens must be > 0");
  if (!(c.prefill_ms_per_layer >= 0) || c.prefill_ms_per_layer > 10'000)
    return invalid("--prefill-ms-per-layer must be in [0, 10000] ms");
  if (c.prefill_pool_mib == 0) return invalid("--prefill-pool-mib must be > 0");
  if (!(c.time_scale >= 0)) return invalid("--time-scale must be >= 0");
  if (!(c.fault_rate >= 0 && c.fault_rate <= 1)) return invalid("--fault-rate must be in [0, 1]");
  if (c.fault_rate > 0 && !c.faults.empty()) {
    return invalid("--fault-rate is a shorthand for a --faults plan: give one of them, not both");
  }
  {
    auto plan = parse_fault_plan(effective_faults(c), c.prefill_tp, c.decode_tp, c.prefill_dp,
                                 c.decode_dp);
    if (!plan.ok()) return invalid(plan.status().message());
    c.fault_plan = *plan;
  }
  if (all_decode > 1) {
    // A prefill rank learns a room's decode instance from its metadata or renewal; a decode rank
    // that stays silent (timeout at prefill) never sends either, so with several decode instances
    // the prefill's timeout has no decode rank to tell, and the decode room waits for ever.
    for (const auto& item : c.fault_plan.items) {
      if (item.kind == "timeout" && (item.place.empty() || item.place.rfind("prefill", 0) == 0))
        return invalid(fmt::format("--faults {}: timeout at a prefill rank is not supported with more than one "
                                   "decode instance (a prefill rank cannot tell a decode instance it never heard "
                                   "from; use timeout@decode)",
                                   item.kind));
    }
  }
  if (xpyd) {
    // The orchestrator's planned kills, network faults and pauses address instance 0's ranks only.
    for (const auto& item : c.fault_plan.items) {
      if (item.kind == "peer_death" || item.kind == "restart" || item.is_net() || item.kind == "pause")
        return invalid(fmt::format("--faults {}: not supported with --prefill-instances {} --decode-instances {} "
                                   "{}(peer deaths, restarts, network faults and pauses need one instance of each)",
                                   item.kind, c.prefill_instances, c.decode_instances,
                                   c.scale.empty() ? "" : "--scale " + c.scale + " "));
    }
    if (!c.hosts_file.empty() && !c.scale.empty())
      return invalid("--scale starts and removes instances on this host only; it cannot be given with --hosts");
    if (!c.hosts_file.empty())
      return invalid("--hosts places one prefill and one decode instance; it cannot be given with "
                     "--prefill-instances or --decode-instances above 1");
  }
  for (const auto& item : c.fault_plan.items)
    if (item.kind == "corrupt" && !c.integrity)
      return invalid("--faults corrupt needs --integrity (the decode rank's integrity check is what detects it)");
  if (c.restart_delay_ms < 0) return invalid("--restart-delay-ms must be >= 0");
  for (const DeadlineField& f : deadline_fields()) {
    if (c.deadlines.*f.member <= 0) {
      return invalid(fmt::format("{} must be > 0 ms, got {}", f.option, c.deadlines.*f.member));
    }
  }
  if (Status st = check_transport_name(c.transport); !st.ok()) {
    return invalid("--transport: " + st.message());
  }
  if (c.transfer_shards < 1 || c.transfer_shards > kMaxTransportShards) {
    return invalid(fmt::format("--transfer-shards must be in 1..{}, got {}", kMaxTransportShards,
                               c.transfer_shards));
  }
  if (c.max_inflight < 1) return invalid("--max-inflight must be >= 1");
  if (Status st = validate_hosts(c); !st.ok()) return st;
  if (c.out.empty()) return invalid("--out must not be empty");
  if (!(c.ready_timeout_s > 0) || !(c.request_timeout_s > 0) || !(c.timeout_s > 0)) {
    return invalid("timeouts must be > 0");
  }

  auto trace = load_trace(c.trace, c.max_requests);
  if (!trace.ok()) return invalid("trace " + c.trace + ": " + trace.status().message());
  if (trace->empty()) return invalid("trace " + c.trace + " has no requests");
  size_t once = 0;
  for (const auto& item : c.fault_plan.items) once += item.once && item.kind != "peer_death" && item.kind != "restart";
  if (once > trace->size()) {
    return invalid(fmt::format("--faults has {} 'once' room faults but the replay has only {} requests",
                               once, trace->size()));
  }
  if (c.fault_plan.has_net_faults()) {
    // net_fault_executor.h carries them out on the --hosts test hosts (through their exec prefix).
    if (!c.hosts) return invalid("link_down and partition act on hosts of a --hosts file, and there is none");
    for (const auto& item : c.fault_plan.items) {
      if (item.is_net() && !c.hosts->hosts.count(item.place))
        return invalid(fmt::format("--faults {}@{}: no host {} in {}", item.kind, item.place, item.place, c.hosts_file));
    }
    if (trace->size() < 2) return invalid("link_down and partition need at least 2 requests (rooms in flight)");
  }
  if (c.fault_plan.has_peer_death() && trace->size() < 2) {
    return invalid("peer_death needs at least 2 requests (the kill happens while rooms are in flight)");
  }

  if (c.models_file.empty()) c.models_file = default_models_file();
  bool ok = false;
  const std::string models_text = read_file(c.models_file, ok);
  if (!ok) return invalid("cannot read the models file " + c.models_file);
  auto models = parse_models_json(models_text);
  if (!models.ok()) return invalid("models file " + c.models_file + ": " + models.status().message());
  auto model = find_model(*models, c.model);
  if (!model.ok()) return invalid(model.status().message());

  if (c.pool_mib == 0) {
    c.pool_mib = default_pool_mib(mem_available_bytes(), prefill_ranks, c.prefill_pool_mib,
                                  decode_ranks);
    c.pool_mib_auto = true;
  }
  // The same layout check the ranks make: each pool must hold at least one page per buffer.
  for (auto [tp, mib, what] : {std::tuple{c.prefill_tp, c.prefill_pool_mib, "--prefill-pool-mib"},
                               std::tuple{c.decode_tp, c.pool_mib, "--pool-mib"}}) {
    auto layout = make_layout(*model, tp, 0, c.page_size, mib * 1024 * 1024, 1);
    if (!layout.ok()) {
      return invalid(fmt::format("{} {} with --page-size {} for {} at TP {}: {}", what, mib,
                                 c.page_size, c.model, tp, layout.status().message()));
    }
  }
  // Pools larger than the machine can never be backed; refuse them here rather than let a rank
  // thrash and be OOM-killed (other processes with it).
  const uint64_t want_mib = uint64_t(prefill_ranks) * c.prefill_pool_mib + uint64_t(decode_ranks) * c.pool_mib;
  const uint64_t total = meminfo_bytes("MemTotal");
  if (total > 0 && want_mib * 1024 * 1024 > total) {
    return invalid(fmt::format("the pools need {} MiB ({} x --prefill-pool-mib {} + {} x --pool-mib {}) "
                               "but this machine has {} MiB of memory",
                               want_mib, prefill_ranks, c.prefill_pool_mib, decode_ranks, c.pool_mib,
                               total / (1024 * 1024)));
  }
  if (!c.break_rank.empty()) {
    auto r = RankId::parse(c.break_rank);
    if (!r || r->engine_id != 0 ||
        r->dp_rank >= (r->role == Role::kPrefill ? c.prefill_dp : c.decode_dp) ||
        r->tp_rank >= (r->role == Role::kPrefill ? c.prefill_tp : c.decode_tp)) {
      return invalid("--test-break-rank must name a rank of this replay, got '" + c.break_rank + "'");
    }
  }
  if (c.exe.empty()) c.exe = self_exe();
  std::error_code ec;
  c.out = fs::absolute(c.out, ec).lexically_normal().string();
  if (!c.out.empty() && c.out.back() == '/') c.out.pop_back();
  return Status::Ok();
}

uint32_t instances_in_all(const ReplayConfig& c, Role role) {
  return total_instances(c.scale_events, role, role == Role::kPrefill ? c.prefill_instances : c.decode_instances);
}

std::string effective_faults(const ReplayConfig& c) {
  return c.faults.empty() ? fault_rate_plan(c.fault_rate).str() : c.faults;
}

}  // namespace kvferry::replay
