// The options of `kvferry replay` (orchestrator.h): ReplayConfig, its JSON form (the report's
// `config`), the automatic decode pool size, and validate(), which checks every option, the
// trace and the model before anything starts.
// Thread contract: plain data and functions; validate() reads files (trace, models, /proc/meminfo).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvferry/deadlines.h"
#include "kvferry/error.h"
#include "replay/fault_plan.h"
#include "replay/hosts.h"
#include "replay/scale_plan.h"

namespace kvferry::replay {

struct ReplayConfig {
  std::string trace;
  std::string model = "Llama-3.1-8B";
  std::string models_file;  // default: default_models_file() (core/data_dir.h)
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  uint32_t prefill_dp = 1;  // DP groups of the prefill engine, each prefill_tp ranks
  uint32_t decode_dp = 1;
  // xPyD (--prefill-instances / --decode-instances, 1..8 each): engine instances per role, each
  // TP x DP ranks of its own; every prefill instance has its own bootstrap service. With more than
  // one instance of either role: no peer deaths, restarts, network faults, pauses or --hosts.
  uint32_t prefill_instances = 1;
  uint32_t decode_instances = 1;
  // --scale (scale_plan.h): instances that join and leave while the trace is served; the two
  // counts above are the ones there from the start. Not with --hosts, --metrics, peer deaths,
  // restarts, network faults or pauses. scale_events: set by validate().
  std::string scale;
  std::vector<ScaleEvent> scale_events;
  uint32_t page_size = 64;         // tokens
  uint64_t pool_mib = 0;           // decode pool per rank; 0: automatic (default_pool_mib)
  bool pool_mib_auto = false;      // set by validate() when pool_mib was chosen automatically
  uint64_t prefill_pool_mib = 1024;  // prefill staging per rank
  uint64_t chunk_tokens = 8192;
  // Prefill compute model (driver/prefill_driver.h): each layer of each prefill chunk takes this
  // many ms (0: none, pages are sent as soon as they are filled); with `layerwise` each layer is
  // sent as its compute ends, otherwise the chunk after its last layer. The report then gives
  // every request's transfer tail (docs/report.md "transfer_tail_ms").
  double prefill_ms_per_layer = 0;
  bool layerwise = false;
  uint64_t max_requests = 0;       // 0: whole trace
  double time_scale = 0;
  double fault_rate = 0;            // shorthand: fault_rate_plan() (fault_plan.h)
  std::string faults;               // --faults spec (fault_plan.h); not together with fault_rate
  FaultPlan fault_plan;             // set by validate() from faults or fault_rate
  int64_t restart_delay_ms = 1500;  // peer_death: from the kill to the restart
  Deadlines deadlines;              // passed to every rank (deadlines.h)
  uint64_t seed = 1;
  std::string transport = "shm";   // shm | tcp
  uint32_t transfer_shards = 1;    // every rank's transfer worker shards (TransportOptions::shards)
  bool integrity = false;          // every rank's ManagerConfig::integrity (--integrity)
  uint32_t max_inflight = 16;
  std::string out = "out/replay";
  double ready_timeout_s = 180;    // engines up
  double request_timeout_s = 300;  // router gives up on a request
  double timeout_s = 3600;         // the whole replay
  std::string exe;                 // kvferry executable for children; default: this process's
  // --hosts FILE (hosts.h): the host of every process; set by validate() from hosts_file.
  // Without it every process runs here and binds and advertises kDefaultHost (kvferry/net.h).
  std::string hosts_file;
  std::optional<HostsFile> hosts;
  // Test hook (hidden option --test-break-rank): this rank ("decode/tp1") is started with
  // --page-size 0, so it cannot start; exercises supervision with real processes.
  std::string break_rank;
  // --metrics: every rank of every DP group serves Prometheus metrics on a port it binds itself
  // (port 0) and reports in DIR/metrics/<file>.port; DIR/metrics.json names every rank's port
  // file, port and URL; each rank writes its final metrics to DIR/metrics/<file>.prom at exit
  // (<file> as its log file: "decode-tp0-dp1"; docs/metrics.md).
  bool metrics = false;
  // Progress on `err`: "bar" (one redrawn terminal line, 4 times a second), "lines" (a plain line
  // every progress_interval_s), "off". The CLI's default: bar when stderr is a terminal, else lines.
  std::string progress = "off";
  double progress_interval_s = 5;

  // All options as a JSON object (the report's `config`).
  std::string to_json() const;
};

// Default decode pool per rank in MiB: 60% of MemAvailable minus the prefill staging
// (prefill ranks x prefill_pool_mib), split over the decode ranks, capped at 7168 and at least
// 64. Ranks: TP x DP of each engine.
uint64_t default_pool_mib(uint64_t mem_available_bytes, uint32_t prefill_ranks,
                          uint64_t prefill_pool_mib, uint32_t decode_ranks);

// Checks every option, the trace (every line), the model, that each pool holds a page and that
// all pools together fit in MemTotal; fills defaults (models_file, pool_mib, exe) and makes `out`
// absolute. kInvalidArgument with a message for the user.
Status validate(ReplayConfig& config);

// The instances of `role` started in all: the initial ones and (--scale) every join.
uint32_t instances_in_all(const ReplayConfig& c, Role role);

// The fault plan as passed to the router: `faults` if given, else fault_rate_plan(fault_rate).
std::string effective_faults(const ReplayConfig& c);

}  // namespace kvferry::replay
