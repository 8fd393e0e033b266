// `kvferry bench` (transfer benchmark, src/bench/bench.h) and `kvferry bench-rank` (internal: one
// rank of it).
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "bench/bench.h"
#include "cli/commands.h"
#include "cli/memory_option.h"
#include "core/data_dir.h"
#include "kvferry/transport.h"

namespace kvferry::cli {

void add_bench_command(CLI::App& app) {
  auto cfg = std::make_shared<bench::BenchConfig>();
  cfg->models_file = default_models_file();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Transfer benchmark: prefill and decode ranks as processes, no trace, no verification");
  cmd->add_option("--model", cfg->model, "model geometry name (data/models.json)")->capture_default_str();
  cmd->add_option("--models-file", cfg->models_file, "model geometry JSON")->capture_default_str();
  cmd->add_option("--layers", cfg->layers, "only the first N layers (0: all; control-plane mode: 1)")
      ->capture_default_str();
  cmd->add_option("--prefill-tp", cfg->prefill_tp, "prefill engine TP size")->capture_default_str();
  cmd->add_option("--decode-tp", cfg->decode_tp, "decode engine TP size")->capture_default_str();
  cmd->add_option("--tokens", cfg->tokens, "input tokens per request (room)")->capture_default_str();
  cmd->add_option("--page-size", cfg->page_size, "tokens per KV page")->capture_default_str();
  cmd->add_option("--chunk-tokens", cfg->chunk_tokens, "tokens per prefill send()")->capture_default_str();
  cmd->add_option("--concurrency", cfg->concurrency, "rooms in flight per rank")->capture_default_str();
  cmd->add_option("--rate", cfg->rate, "rooms/s opened (0: as fast as they complete)")->capture_default_str();
  cmd->add_option("--transport", cfg->transport, "shm or tcp")->capture_default_str();
  // --memory: replay's host|cuda (memory_option.h) plus engine; host is kvferry's pool
  // (BenchConfig::memory "pool"), cuda is refused before anything starts.
  auto memory = std::make_shared<std::string>("host");
  cmd->add_option("--memory", *memory,
                  "host: each rank's KV in one pool kvferry allocates (\"pool\" in the result JSON); engine: "
                  "one host buffer per layer tensor allocated by the rank and registered, as vLLM's "
                  "per-layer tensors; cuda: GPU memory (not built yet: refused with the reason, docs/gpu.md)")
      ->check(CLI::IsMember({"host", "engine", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--transfer-shards", cfg->transfer_shards,
                  "transfer worker shards per rank, 1..8 (one progress thread each)")
      ->capture_default_str();
  cmd->add_flag("--integrity", cfg->integrity,
               "end-to-end integrity: every room's bytes are digested on both sides and compared "
               "(ManagerConfig::integrity)");
  cmd->add_option("--tcp-congestion", cfg->tcp_congestion,
                  "TCP congestion control of the tcp lane's sockets (a name the kernel allows; default: the "
                  "host's own)")
      ->capture_default_str();
  cmd->add_option("--duration", cfg->duration_s, "measured window in seconds")->capture_default_str();
  cmd->add_option("--warmup", cfg->warmup_s, "seconds before the window (default min(1, duration/5))");
  cmd->add_option("--rss-checkpoint", cfg->rss_checkpoint,
                  "also record each rank's RssAnon after this many rooms (0: off)")
      ->capture_default_str();
  cmd->add_option("--page-order", cfg->page_order,
                  "sequential, or random: both sides' page lists shuffled (fragmented pools: one write per page)")
      ->check(CLI::IsMember({"sequential", "random"}))
      ->capture_default_str();
  cmd->add_option("--prefill-ms-per-layer", cfg->prefill_ms_per_layer,
                  "compute model: each prefill rank computes a room's layers this long each, one room at a "
                  "time, before they can be sent (0: no compute)")
      ->capture_default_str();
  cmd->add_flag("--layerwise", cfg->layerwise,
                "send each layer as its compute ends (default: the whole room after the last layer)");
  cmd->add_option("--out", cfg->out, "result JSON path");
  cmd->add_option("--work-dir", cfg->work_dir, "rank files and logs (default: <out dir>/bench-work)");
  cmd->add_option("--timeout-s", cfg->timeout_s, "ranks ready within, and done this long after the window")
      ->capture_default_str();
  cmd->callback([cfg, memory] {
    if (const int m = check_memory_kind("bench", *memory, std::cerr); m != 0) throw CLI::RuntimeError(m);
    cfg->memory = *memory == "engine" ? "engine" : "pool";
    const int rc = bench::run_bench(*cfg, std::cout, std::cerr);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });

  auto o = std::make_shared<bench::BenchRankOptions>();
  auto role = std::make_shared<std::string>("prefill");
  CLI::App* r = app.add_subcommand("bench-rank", "one rank of `kvferry bench` (internal)");
  r->group("");  // hidden
  r->add_option("--role", *role)->check(CLI::IsMember({"prefill", "decode"}))->required();
  r->add_option("--tp-rank", o->tp_rank)->required();
  r->add_option("--tp-size", o->tp_size)->required();
  r->add_option("--peer-tp-size", o->peer_tp_size)->required();
  r->add_option("--model", o->model);
  r->add_option("--models-file", o->models_file)->required();
  r->add_option("--layers", o->layers);
  r->add_option("--tokens", o->tokens);
  r->add_option("--page-size", o->page_size);
  r->add_option("--chunk-tokens", o->chunk_tokens);
  r->add_option("--concurrency", o->concurrency);
  r->add_option("--rate", o->rate);
  r->add_option("--transport", o->transport)->check(CLI::IsMember(transport_names()));
  r->add_option("--transfer-shards", o->transfer_shards)->check(CLI::Range(1u, kMaxTransportShards));
  r->add_option("--tcp-congestion", o->tcp_congestion);
  r->add_option("--integrity", o->integrity);
  r->add_option("--bootstrap", o->bootstrap)->required();
  r->add_option("--dir", o->dir)->required();
  r->add_option("--rss-checkpoint", o->rss_checkpoint);
  r->add_option("--page-order", o->page_order)->check(CLI::IsMember({"sequential", "random"}));
  r->add_option("--prefill-ms-per-layer", o->prefill_ms_per_layer);
  r->add_option("--layerwise", o->layerwise);
  r->add_option("--memory", o->memory)->check(CLI::IsMember({"pool", "engine"}));
  r->add_option("--timeout-s", o->timeout_s);
  r->callback([o, role] {
    o->prefill = *role == "prefill";
    const int rc = bench::run_bench_rank(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
