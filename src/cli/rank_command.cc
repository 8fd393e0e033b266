// `kvferry rank`: one engine rank (internal; `kvferry replay` spawns these).
#include <CLI/CLI.hpp>
#include <pthread.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/host_options.h"
#include "core/data_dir.h"
#include "core/stop_request.h"
#include "driver/rank.h"
#include "kvferry/deadlines.h"
#include "kvferry/log.h"

namespace kvferry::cli {
namespace {

// SIGTERM/SIGINT stop a rank in two steps. A thread waiting for them (installed before any other
// thread starts, so every thread inherits the blocked mask and only this one receives them) logs
// why, flushes the log and asks the engine loop to stop (core/stop_request.h): the loop finishes
// its step, the rank writes its metrics file and flushes again, and the process then ends by the
// signal (as a plain kill would). A rank not yet in its engine loop (registering, connecting) or
// stuck in a step is ended by the signal after kStopGraceMs, its log already flushed.
constexpr int kStopGraceMs = 3000;

void end_by_signal(int sig) {
  flush_logging();
  std::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
}

void stop_on_termination_signals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::thread([stop] {
    int sig = 0;
    if (sigwait(&stop, &sig) != 0) return;
    log_event(LogLevel::kInfo, "rank", std::string("stopped by ") + strsignal(sig));
    flush_logging();
    request_stop(sig);
    std::this_thread::sleep_for(std::chrono::milliseconds(kStopGraceMs));
    end_by_signal(sig);
  }).detach();
}

}  // namespace

void add_rank_command(CLI::App& app) {
  auto opts = std::make_shared<RankOptions>();
  auto role = std::make_shared<std::string>("prefill");
  opts->models_file = default_models_file();
  CLI::App* cmd = app.add_subcommand("rank", "run one engine rank (internal: spawned by `kvferry replay`)");
  cmd->add_option("--role", *role, "prefill or decode")->check(CLI::IsMember({"prefill", "decode"}))->required();
  cmd->add_option("--tp-rank", opts->tp_rank, "this rank's tensor-parallel index")->required();
  cmd->add_option("--tp-size", opts->tp_size, "ranks in this engine")->required();
  cmd->add_option("--peer-tp-size", opts->peer_tp_size, "ranks in the other engine (default: same)");
  cmd->add_option("--dp-rank", opts->dp_rank, "this rank's data-parallel group");
  cmd->add_option("--peer-dp-size", opts->peer_dp_size, "DP groups of the other engine");
  cmd->add_option("--instance", opts->instance,
                  "this engine's instance in an xPyD replay (a decode rank's engine id; default 0)")
      ->check(CLI::Range(0, 15));
  cmd->add_option("--model", opts->model, "model geometry name");
  cmd->add_option("--models-file", opts->models_file, "model geometry file");
  cmd->add_option("--page-size", opts->page_size, "tokens per page");
  cmd->add_option("--pool-mib", opts->pool_mib, "this rank's KV pool in MiB");
  cmd->add_option("--chunk-tokens", opts->chunk_tokens, "prefill: tokens per send()");
  cmd->add_option("--prefill-ms-per-layer", opts->prefill_ms_per_layer,
                  "prefill: every layer of every chunk takes this long to compute (0: no compute model)");
  cmd->add_flag("--layerwise", opts->layerwise, "prefill: send each layer as its compute ends");
  cmd->add_option("--bootstrap", opts->bootstrap, "bootstrap service host:port");
  cmd->add_option("--engine-endpoint", opts->engine_endpoint, "the engine leader's endpoint")->required();
  cmd->add_option("--router-endpoint", opts->router_endpoint, "the router's endpoint")->required();
  cmd->add_option("--transport", opts->transport, "a registered transport name: shm or tcp (kvferry/transport.h)")
      ->check(CLI::IsMember(transport_names()));
  cmd->add_option("--transfer-shards", opts->transfer_shards,
                  "transfer worker shards (UCX workers, one progress thread each; a room stays on one)")
      ->check(CLI::Range(1u, kMaxTransportShards));
  cmd->add_flag("--integrity", opts->integrity, "end-to-end integrity (ManagerConfig::integrity)");
  cmd->add_option("--log-file", opts->log_file, "JSON lines log file");
  add_host_options(cmd, &opts->bind_host, &opts->advertise_host,
                   std::string(kDefaultHost) + "; the engine leader's socket: its --engine-endpoint host",
                   "the bind host, the engine leader's: its --engine-endpoint host; for a wildcard bind, this "
                   "machine's host name");
  cmd->add_option("--metrics-port", opts->metrics_port, "serve Prometheus metrics on the bind host, port PORT, /metrics");
  cmd->add_option("--metrics-port-file", opts->metrics_port_file,
                  "also serve metrics, and write their bound port here (without --metrics-port: any free "
                  "port)");
  cmd->add_option("--metrics-file", opts->metrics_file, "write the final metrics (text format) here at exit");
  cmd->add_option("--port-file", opts->port_file,
                  "write the bound port of the engine socket here: the leader's --engine-endpoint (port 0: any "
                  "free port), a follower's own");
  cmd->add_option("--engine-port", opts->engine_port,
                  "follower: bind the engine socket on this port (default: any free port)");
  cmd->add_option("--control-port", opts->control_port,
                  "bind the control socket (peers' frames) on this port (default: any free port)");
  cmd->add_option("--control-port-file", opts->control_port_file, "write the control socket's bound port here");
  opts->deadlines = deadlines_from_env();
  for (const DeadlineField& f : deadline_fields())
    cmd->add_option(f.option, opts->deadlines.*f.member, std::string(f.help) + " (env " + f.env + ")");
  cmd->callback([opts, role] {
    opts->role = *role == "prefill" ? Role::kPrefill : Role::kDecode;
    stop_on_termination_signals();
    int rc = run_rank(*opts);
    if (stop_signal() != 0) end_by_signal(stop_signal());
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
