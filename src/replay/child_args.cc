// The command lines of the child processes (child_args.h).
#include "replay/child_args.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "kvferry/deadlines.h"
#include "kvferry/error.h"
#include "kvferry/net.h"
#include "kvferry/port_file.h"
#include "replay/fault_plan.h"

namespace kvferry::replay {
namespace {

std::string num(double v) { return fmt::format("{}", v); }

}  // namespace

const HostEntry* child_host(const ReplayConfig& c, const std::string& file) {
  if (!c.hosts) return nullptr;
  if (file == "bootstrap") return &c.hosts->bootstrap();
  if (file == "router") return &c.hosts->router();
  std::string name = file;
  std::replace(name.begin(), name.end(), '-', '/');
  const auto r = RankId::parse(name);
  if (!r || r->engine_id != 0) return nullptr;
  const bool prefill = r->role == Role::kPrefill;
  if (r->tp_rank >= (prefill ? c.prefill_tp : c.decode_tp) || r->dp_rank >= (prefill ? c.prefill_dp : c.decode_dp)) {
    return nullptr;
  }
  return &c.hosts->rank(prefill, r->tp_rank, r->dp_rank);
}

std::string child_address(const ReplayConfig& c, const std::string& file) {
  const HostEntry* h = child_host(c, file);
  return h ? h->address : std::string(kDefaultHost);
}

std::vector<std::string> child_exec(const ReplayConfig& c, const std::string& file) {
  const HostEntry* h = child_host(c, file);
  return h ? h->exec : std::vector<std::string>{};
}

std::string bootstrap_address(const ReplayConfig& c) {
  return c.hosts ? c.hosts->bootstrap().address : std::string(kDefaultHost);
}
std::string router_address(const ReplayConfig& c) {
  return c.hosts ? c.hosts->router().address : std::string(kDefaultHost);
}
std::string replay_address(const ReplayConfig& c) {
  return c.hosts ? c.hosts->replay().address : std::string(kDefaultHost);
}
std::string rank_address(const ReplayConfig& c, bool prefill, uint32_t tp_rank, uint32_t dp_rank) {
  return c.hosts ? c.hosts->rank(prefill, tp_rank, dp_rank).address : std::string(kDefaultHost);
}

std::string placement_text(const ReplayConfig& c) {
  if (!c.hosts) return "";
  std::map<std::string, std::string> on;  // host key -> what runs there
  auto add = [&](const std::string& key, const std::string& what) {
    on[key] += (on[key].empty() ? "" : ", ") + what;
  };
  add(c.hosts->place.replay, "the replay (orchestrator)");
  add(c.hosts->place.bootstrap, "bootstrap");
  add(c.hosts->place.router, "router");
  for (bool prefill : {true, false}) {
    for (uint32_t g = 0; g < (prefill ? c.prefill_dp : c.decode_dp); ++g) {
      for (uint32_t r = 0; r < (prefill ? c.prefill_tp : c.decode_tp); ++r) {
        add(c.hosts->rank(prefill, r, g).name, rank_name(prefill, r, g));
      }
    }
  }
  std::string text;
  for (const auto& [key, what] : on) {
    text += fmt::format("replay: host {} ({}): {}\n", key, c.hosts->host(key).address, what);
  }
  return text;
}

std::string logs_dir(const ReplayConfig& c) { return c.out + "/logs"; }

std::string control_port_file(const ReplayConfig& c, const std::string& file) {
  return fmt::format("{}/{}.control.port", logs_dir(c), file);
}

Result<std::vector<std::string>> restart_ports(const ReplayConfig& c, const std::string& file) {
  auto rank = RankId::parse(file_rank_name(file));
  if (!rank) return Status(ErrorCode::kInvalidArgument, file + " is not a rank's file name");
  std::vector<std::string> args;
  auto control = read_port_file(control_port_file(c, file));
  if (!control) return Status(ErrorCode::kInternal, "no control port in " + control_port_file(c, file));
  args.insert(args.end(), {"--control-port", std::to_string(*control)});
  if (rank->tp_rank != 0) {  // a leader's engine port is in its --engine-endpoint already
    const std::string engine_file = fmt::format("{}/{}.port", logs_dir(c), file);
    auto engine = read_port_file(engine_file);
    if (!engine) return Status(ErrorCode::kInternal, "no engine port in " + engine_file);
    args.insert(args.end(), {"--engine-port", std::to_string(*engine)});
  }
  if (c.metrics) {
    const std::string metrics_file = fmt::format("{}/metrics/{}.port", c.out, file);
    auto metrics = read_port_file(metrics_file);
    if (!metrics) return Status(ErrorCode::kInternal, "no metrics port in " + metrics_file);
    args.insert(args.end(), {"--metrics-port", std::to_string(*metrics)});
  }
  return args;
}

std::string file_rank_name(const std::string& file) {
  // "decode-tp1-dp2" -> "decode/tp1/dp2"
  std::string name = file;
  std::replace(name.begin(), name.end(), '-', '/');
  return name;
}

std::string rank_name(bool prefill, uint32_t tp_rank, uint32_t dp_rank, uint32_t instance) {
  return RankId{prefill ? Role::kPrefill : Role::kDecode, instance, tp_rank, dp_rank}.str();
}

std::string rank_file(bool prefill, uint32_t tp_rank, uint32_t dp_rank, uint32_t instance) {
  std::string f = rank_name(prefill, tp_rank, dp_rank, instance);
  std::replace(f.begin(), f.end(), '/', '-');
  return f;
}

std::string bootstrap_file(uint32_t instance) {
  return instance == 0 ? std::string("bootstrap") : fmt::format("bootstrap{}", instance);
}

std::vector<std::string> bootstrap_args(const ReplayConfig& c, const Ports& p, uint32_t instance) {
  const std::string file = bootstrap_file(instance);
  std::vector<std::string> args = {c.exe,  "bootstrap", "--host", bootstrap_address(c), "--port",
                                   std::to_string(p.bootstrap), "--log-file",
                                   logs_dir(c) + "/" + file + ".jsonl"};
  if (p.bootstrap == 0) {
    args.push_back("--port-file");
    args.push_back(logs_dir(c) + "/" + file + ".port");
  }
  return args;
}

std::vector<std::string> rank_args(const ReplayConfig& c, const Ports& p, bool prefill,
                                   uint32_t tp_rank, uint32_t dp_rank, uint32_t instance) {
  const std::string role = prefill ? "prefill" : "decode";
  const uint32_t tp = prefill ? c.prefill_tp : c.decode_tp;
  const auto& engines = prefill ? p.prefill_engines : p.decode_engines;
  const uint16_t engine_port = dp_rank < engines.size() ? engines[dp_rank] : 0;
  const std::string file = rank_file(prefill, tp_rank, dp_rank, instance);
  const bool broken = c.break_rank == rank_name(prefill, tp_rank, dp_rank, instance);
  std::vector<std::string> args = {c.exe,
          "rank",
          "--role", role,
          "--tp-rank", std::to_string(tp_rank),
          "--tp-size", std::to_string(tp),
          "--peer-tp-size", std::to_string(prefill ? c.decode_tp : c.prefill_tp),
          "--model", c.model,
          "--models-file", c.models_file,
          "--page-size", broken ? "0" : std::to_string(c.page_size),
          "--pool-mib", std::to_string(prefill ? c.prefill_pool_mib : c.pool_mib),
          "--bootstrap", host_port(bootstrap_address(c), p.bootstrap),
          "--engine-endpoint", zmq_endpoint(rank_address(c, prefill, 0, dp_rank), engine_port),
          "--router-endpoint", zmq_endpoint(router_address(c), p.router),
          "--transport", c.transport,
          "--log-file", fmt::format("{}/{}.jsonl", logs_dir(c), file),
          "--chunk-tokens", std::to_string(c.chunk_tokens)};
  if (c.hosts) {  // every socket of the rank on its host's address (advertised: the same)
    args.push_back("--bind-host");
    args.push_back(rank_address(c, prefill, tp_rank, dp_rank));
  }
  if (prefill && c.prefill_ms_per_layer > 0) {  // the compute model (prefill ranks only)
    args.push_back("--prefill-ms-per-layer");
    args.push_back(fmt::format("{}", c.prefill_ms_per_layer));
  }
  if (prefill && c.layerwise) args.push_back("--layerwise");
  if (c.integrity) args.push_back("--integrity");
  if (c.transfer_shards != 1) {  // the rank's default is 1
    args.push_back("--transfer-shards");
    args.push_back(std::to_string(c.transfer_shards));
  }
  const uint32_t peer_dp = prefill ? c.decode_dp : c.prefill_dp;
  if (dp_rank != 0 || peer_dp != 1) {
    for (std::string a : {std::string("--dp-rank"), std::to_string(dp_rank),
                          std::string("--peer-dp-size"), std::to_string(peer_dp)}) {
      args.push_back(std::move(a));
    }
  }
  const auto pinned = same_port_restarts(c.fault_plan);
  const bool restarts = std::find(pinned.begin(), pinned.end(), rank_name(prefill, tp_rank, dp_rank, instance)) != pinned.end();
  if ((tp_rank == 0 && engine_port == 0) || (tp_rank != 0 && restarts)) {
    args.push_back("--port-file");
    args.push_back(fmt::format("{}/{}.port", logs_dir(c), file));
  }
  if (restarts) {  // restart@ (fault_plan.h): the ports its restart binds again (restart_ports())
    args.push_back("--control-port-file");
    args.push_back(control_port_file(c, file));
  }
  for (std::string& a : deadline_args(c.deadlines)) args.push_back(std::move(a));
  if (instance != 0) args.insert(args.end(), {"--instance", std::to_string(instance)});
  if (c.metrics) {
    args.insert(args.end(), {"--metrics-port-file", fmt::format("{}/metrics/{}.port", c.out, file),
                             "--metrics-file", fmt::format("{}/metrics/{}.prom", c.out, file)});
  }
  return args;
}

std::vector<std::string> router_args(const ReplayConfig& c, const Ports& p) {
  std::vector<std::string> args = {c.exe,
          "router",
          "--trace", c.trace,
          "--max-requests", std::to_string(c.max_requests),
          "--time-scale", num(c.time_scale),
          "--seed", std::to_string(c.seed),
          "--prefill-tp", std::to_string(c.prefill_tp),
          "--decode-tp", std::to_string(c.decode_tp),
          "--prefill-dp", std::to_string(c.prefill_dp),
          "--decode-dp", std::to_string(c.decode_dp),
          "--endpoint", zmq_endpoint(router_address(c), p.router),
          "--max-inflight", std::to_string(c.max_inflight),
          "--results", c.out + "/results.json",
          "--log-file", logs_dir(c) + "/router.jsonl",
          "--ready-timeout-s", num(c.ready_timeout_s),
          "--request-timeout-s", num(c.request_timeout_s)};
  // --scale: the instances there from the start, and every prefill instance's bootstrap service
  // (a joining one's is started with the others, before the router).
  const uint32_t all_prefill = instances_in_all(c, Role::kPrefill);
  if (all_prefill > 1 || instances_in_all(c, Role::kDecode) > 1) {  // xPyD
    args.insert(args.end(), {"--prefill-instances", std::to_string(c.prefill_instances), "--decode-instances",
                             std::to_string(c.decode_instances)});
    if (!c.scale.empty()) args.insert(args.end(), {"--scale", c.scale});
    for (uint32_t i = 0; all_prefill > 1 && i < all_prefill; ++i) {
      const uint16_t port = i < p.prefill_bootstraps.size() ? p.prefill_bootstraps[i] : 0;
      args.insert(args.end(), {"--prefill-bootstrap", host_port(bootstrap_address(c), port)});
    }
  }
  if (const std::string faults = effective_faults(c); !faults.empty()) {
    args.push_back("--faults");
    args.push_back(faults);
  }
  if (p.router == 0) {
    args.push_back("--port-file");
    args.push_back(logs_dir(c) + "/router.port");
  }
  // The leaders' engine endpoints reach the router in their "ready" frames.
  if (p.orchestrator != 0) {
    args.push_back("--orchestrator");
    args.push_back(zmq_endpoint(replay_address(c), p.orchestrator));
  }
  return args;
}

}  // namespace kvferry::replay
