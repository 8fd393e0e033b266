// `kvferry replay`: the main job (src/replay/orchestrator.h does the work; docs/report.md).
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/memory_option.h"
#include "core/data_dir.h"
#include "kvferry/deadlines.h"
#include "kvferry/transport.h"
#include "replay/orchestrator.h"

namespace kvferry::cli {

void add_replay_command(CLI::App& app) {
  auto cfg = std::make_shared<replay::ReplayConfig>();
  cfg->models_file = default_models_file();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Replay a request trace through real prefill/decode ranks and write a report");
  cmd->add_option("--trace", cfg->trace,
                  "Mooncake JSONL or Azure CSV trace (detected); a bare name not found here is looked "
                  "up in the bundled traces (<data dir>/traces)")
      ->required();
  cmd->add_option("--model", cfg->model, "model geometry name from --models-file")->capture_default_str();
  cmd->add_option("--models-file", cfg->models_file, "model geometry JSON")->capture_default_str();
  cmd->add_option("--prefill-tp", cfg->prefill_tp, "prefill engine TP size")->capture_default_str();
  cmd->add_option("--decode-tp", cfg->decode_tp, "decode engine TP size")->capture_default_str();
  cmd->add_option("--prefill-dp", cfg->prefill_dp,
                  "prefill DP groups (each --prefill-tp ranks; a room goes to group room % DP)")
      ->capture_default_str();
  cmd->add_option("--decode-dp", cfg->decode_dp,
                  "decode DP groups (each --decode-tp ranks; a room goes to group room % DP)")
      ->capture_default_str();
  cmd->add_option("--prefill-instances", cfg->prefill_instances,
                  "prefill instances (xPyD): each its own engine (TP x DP ranks) and bootstrap service")
      ->capture_default_str();
  cmd->add_option("--decode-instances", cfg->decode_instances,
                  "decode instances (xPyD): each its own engine (TP x DP ranks); the router picks the "
                  "instances with the fewest outstanding rooms per request")
      ->capture_default_str();
  cmd->add_option("--scale", cfg->scale,
                  "instances that join and leave while serving, e.g. \"t=20s:+prefill,t=40s:-decode\" (t from "
                  "the first dispatch; +role starts one more instance, -role drains and removes the live one with "
                  "the highest index; docs/report.md \"Scaling while serving\")");
  cmd->add_option("--page-size", cfg->page_size, "tokens per KV page")->capture_default_str();
  cmd->add_option("--pool-mib", cfg->pool_mib,
                  "decode KV pool per rank in MiB (default: min(7168, (60% of MemAvailable - "
                  "prefill staging) / decode ranks))");
  cmd->add_option("--prefill-pool-mib", cfg->prefill_pool_mib, "prefill staging pool per rank in MiB")
      ->capture_default_str();
  cmd->add_option("--prefill-ms-per-layer", cfg->prefill_ms_per_layer,
                  "prefill compute model: every layer of every prefill chunk takes this long (0: none)")
      ->capture_default_str();
  cmd->add_flag("--layerwise", cfg->layerwise,
                "prefill sends each layer as its compute ends (default: a chunk after its last layer)");
  cmd->add_option("--chunk-tokens", cfg->chunk_tokens, "tokens per prefill send() chunk")
      ->capture_default_str();
  cmd->add_option("--max-requests", cfg->max_requests, "first N requests of the trace (0: all)")
      ->capture_default_str();
  cmd->add_option("--time-scale", cfg->time_scale, "0: as fast as possible, 1: real time")
      ->capture_default_str();
  cmd->add_option("--fault-rate", cfg->fault_rate,
                  "shorthand for --faults transfer@prefill:P/2,decode_fail@decode:P/2")
      ->capture_default_str();
  cmd->add_option("--faults", cfg->faults,
                  "fault plan: KIND[@PLACE]:RATE|once,... with KIND transfer, decode_fail, prefill_fail, timeout, "
                  "abort, peer_death (docs/report.md)");
  cmd->add_option("--restart-delay-ms", cfg->restart_delay_ms,
                  "peer_death: restart the killed rank this long after the kill")
      ->capture_default_str();
  auto bad_env = std::make_shared<std::vector<std::string>>();
  cfg->deadlines = deadlines_from_env(bad_env.get());
  for (const DeadlineField& f : deadline_fields()) {
    cmd->add_option(f.option, cfg->deadlines.*f.member,
                    std::string(f.help) + " (every rank; env " + f.env + ")")
        ->capture_default_str();
  }
  cmd->add_option("--seed", cfg->seed, "seed of rooms and faults")->capture_default_str();
  cmd->add_option("--transport", cfg->transport, "shm or tcp")->capture_default_str();
  auto memory = add_memory_option(cmd);
  cmd->add_option("--transfer-shards", cfg->transfer_shards,
                  "transfer worker shards per rank, 1..8 (one progress thread each)")
      ->capture_default_str();
  cmd->add_flag("--integrity", cfg->integrity,
               "end-to-end integrity on every rank: each room's bytes digested on both sides and compared "
               "(a mismatch fails the room with integrity_error)");
  cmd->add_option("--max-inflight", cfg->max_inflight, "requests dispatched and unfinished at most")
      ->capture_default_str();
  cmd->add_option("--out", cfg->out, "output directory (report.json, logs/)")->capture_default_str();
  cmd->add_option("--ready-timeout-s", cfg->ready_timeout_s, "engines must be up within this")
      ->capture_default_str();
  cmd->add_option("--request-timeout-s", cfg->request_timeout_s,
                  "the router gives up on a request after this")
      ->capture_default_str();
  cmd->add_option("--timeout-s", cfg->timeout_s, "the whole replay must finish within this")
      ->capture_default_str();
  cmd->add_option("--hosts", cfg->hosts_file,
                  "place every process on a host: JSON {\"hosts\": {KEY: {\"address\": ADDR, \"exec\": "
                  "[PREFIX...]}}, \"place\": {\"bootstrap\": KEY, \"router\": KEY, \"prefill\": [KEY per rank], "
                  "\"decode\": [...]}} (README \"Across hosts\"; tests/hosts/hosts.sh makes test hosts)");
  cmd->add_flag("--metrics", cfg->metrics,
               "every rank serves Prometheus metrics on a port it binds (listed in DIR/metrics.json) and "
               "writes its final metrics to DIR/metrics/ (docs/metrics.md)");
  auto progress = std::make_shared<std::string>("auto");
  cmd->add_option("--progress", *progress,
                  "auto (a bar when stderr is a terminal, else plain lines), bar, lines or off")
      ->check(CLI::IsMember({"auto", "bar", "lines", "off"}))
      ->capture_default_str();
  cmd->add_option("--progress-interval-s", cfg->progress_interval_s, "seconds between plain progress lines")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--test-break-rank", cfg->break_rank,
                  "test hook: start this rank (e.g. decode/tp1) with --page-size 0")
      ->group("");  // hidden
  cmd->callback([cfg, bad_env, progress, memory] {
    if (const int rc = check_memory_kind("replay", *memory, std::cerr); rc != 0) throw CLI::RuntimeError(rc);
    cfg->progress = *progress == "auto" ? (::isatty(STDERR_FILENO) ? "bar" : "lines") : *progress;
    if (!bad_env->empty()) {
      std::cerr << "kvferry replay: " << bad_env->front() << " is not a positive integer (ms)\n";
      throw CLI::RuntimeError(2);
    }
    cfg->trace = resolve_trace_file(cfg->trace);
    const int rc = replay::run_replay(*cfg, std::cout, std::cerr);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
