// `kvferry router`: internal, spawned by `kvferry replay` (src/replay/router.h does the work).
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/commands.h"
#include "cli/host_options.h"
#include "kvferry/log.h"
#include "replay/router.h"

namespace kvferry::cli {

void add_router_command(CLI::App& app) {
  auto cfg = std::make_shared<replay::RouterConfig>();
  auto log_file = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("router", "(internal) the replay's request router");
  cmd->group("");  // hidden from --help: spawned by `kvferry replay`
  cmd->add_option("--trace", cfg->trace_path)->required();
  cmd->add_option("--max-requests", cfg->max_requests);
  cmd->add_option("--time-scale", cfg->time_scale);
  cmd->add_option("--fault-rate", cfg->fault_rate);
  cmd->add_option("--faults", cfg->faults, "fault plan (src/replay/fault_plan.h)");
  cmd->add_option("--orchestrator", cfg->orchestrator, "the orchestrator's endpoint (peer deaths)");
  cmd->add_option("--seed", cfg->seed);
  cmd->add_option("--prefill-tp", cfg->prefill_tp)->required();
  cmd->add_option("--decode-tp", cfg->decode_tp)->required();
  cmd->add_option("--prefill-dp", cfg->prefill_dp);
  cmd->add_option("--decode-dp", cfg->decode_dp);
  cmd->add_option("--prefill-instances", cfg->prefill_instances, "prefill instances (xPyD)");
  cmd->add_option("--decode-instances", cfg->decode_instances, "decode instances (xPyD)");
  cmd->add_option("--scale", cfg->scale, "instances that join and leave (src/replay/scale_plan.h)");
  cmd->add_option("--prefill-bootstrap", cfg->prefill_bootstraps,
                  "host:port of each prefill instance's bootstrap service (with --prefill-instances > 1)");
  cmd->add_option("--port-file", cfg->port_file, "write the bound port of --endpoint here");
  cmd->add_option("--endpoint", cfg->endpoint,
                  "the router's endpoint (tcp://host:port): its PULL socket binds it and engines send to it")
      ->required();
  add_host_options(cmd, &cfg->bind_host, &cfg->advertise_host, "the --endpoint host", "the --endpoint host");
  cmd->add_option("--prefill-leader", cfg->prefill_leaders,
                  "prefill tp0 engine endpoint per DP group, instance-major (default: from their ready frames)");
  cmd->add_option("--decode-leader", cfg->decode_leaders,
                  "decode tp0 engine endpoint per DP group, instance-major (default: from their ready frames)");
  cmd->add_option("--max-inflight", cfg->max_inflight);
  cmd->add_option("--results", cfg->results_path)->required();
  cmd->add_option("--log-file", *log_file);
  cmd->add_option("--ready-timeout-s", cfg->ready_timeout_s);
  cmd->add_option("--request-timeout-s", cfg->request_timeout_s);
  cmd->add_option("--stats-timeout-s", cfg->stats_timeout_s);
  cmd->callback([cfg, log_file] {
    init_logging(LogConfig{.rank = "router", .json_path = *log_file});
    const int rc = replay::run_router(*cfg);
    flush_logging();
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
