// `kvferry replay`: the main job. Validates the options, starts the bootstrap service, every
// prefill and decode rank and the router as separate processes of one process group (loopback
// sockets only), supervises them, and writes DIR/report.json (docs/report.md).
//
// Processes (argv[1] is the subcommand of the same executable):
//   bootstrap  kvferry bootstrap --host kDefaultHost --port P --log-file DIR/logs/bootstrap.jsonl
//   ranks      kvferry rank --role prefill|decode --tp-rank R [--dp-rank D] ... (see rank_args()):
//              dp x tp ranks per engine, each DP group its own engine (leader tp0 + followers)
//   router     kvferry router ... --results DIR/results.json
// Each child's stdout+stderr: DIR/logs/<name>.stderr (name: bootstrap, prefill-tp0, ...,
// prefill-tp0-dp1, ..., router; see rank_file()).
// Supervision: any rank or the bootstrap exiting before the router finished, or a failed router,
// kills the whole group, prints the process and its stderr tail, writes a partial report and
// returns non-zero. SIGINT/SIGTERM to the orchestrator stop the router first (it writes the results
// so far), then every rank (SIGTERM; they flush and exit), and write a report of the finished
// requests marked "partial" (docs/metrics.md). No child outlives it
// (process group + PR_SET_PDEATHSIG).
// Planned peer deaths (fault plan): the router asks for the kill over the orchestrator's
// ControlSocket (peer_death_frames.h); the orchestrator SIGKILLs that rank, notes the time
// (CLOCK_MONOTONIC), tells the router, and once the process is reaped and restart_delay_ms passed
// starts the same command line again (its log and stderr files are appended to). That exit is
// not a failure; any other is.
// Thread contract: run_replay() on the main thread (it installs SIGINT/SIGTERM handlers).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "kvferry/deadlines.h"
#include "kvferry/error.h"
#include "replay/fault_plan.h"

namespace kvferry::replay {

struct ReplayConfig {
  std::string trace;
  std::string model = "Llama-3.1-8B";
  std::string models_file;  // default: default_models_file() (core/data_dir.h)
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  uint32_t prefill_dp = 1;  // DP groups of the prefill engine, each prefill_tp ranks
  uint32_t decode_dp = 1;
  uint32_t page_size = 64;         // tokens
  uint64_t pool_mib = 0;           // decode pool per rank; 0: automatic (default_pool_mib)
  bool pool_mib_auto = false;      // set by validate() when pool_mib was chosen automatically
  uint64_t prefill_pool_mib = 1024;  // prefill staging per rank
  uint64_t chunk_tokens = 8192;
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
  uint32_t max_inflight = 16;
  std::string out = "out/replay";
  double ready_timeout_s = 180;    // engines up
  double request_timeout_s = 300;  // router gives up on a request
  double timeout_s = 3600;         // the whole replay
  std::string exe;                 // kvferry executable for children; default: this process's
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

// argv of each child process (exposed for tests). A listening child whose port is 0 here binds
// any free port and writes the port it got to a port file (kvferry/port_file.h) in DIR/logs:
// bootstrap.port, router.port, <rank file>.port for an engine leader. The orchestrator starts
// the children in the order that lets each learn the ports it needs: bootstrap, router, the
// leaders, then their followers (with the leader's bound port). No port is picked ahead of its
// bind, so no other process can take it in between.
struct Ports {
  uint16_t bootstrap = 0, router = 0;
  uint16_t orchestrator = 0;  // 0: no peer deaths planned (the router gets no --orchestrator)
  // Engine endpoint of each DP group's leader, index = DP rank (missing or 0: bind any port).
  std::vector<uint16_t> prefill_engines, decode_engines;
};
// A rank's name ("prefill/tp1", "decode/tp0/dp1": RankId::str(), the DP group only when not 0,
// as in every error's origin) and its file name in DIR/logs ("prefill-tp1", "decode-tp0-dp1").
std::string rank_name(bool prefill, uint32_t tp_rank, uint32_t dp_rank);
std::string rank_file(bool prefill, uint32_t tp_rank, uint32_t dp_rank);
std::vector<std::string> bootstrap_args(const ReplayConfig& c, const Ports& p);
std::vector<std::string> rank_args(const ReplayConfig& c, const Ports& p, bool prefill,
                                   uint32_t tp_rank, uint32_t dp_rank = 0);
std::vector<std::string> router_args(const ReplayConfig& c, const Ports& p);
// The fault plan as passed to the router: `faults` if given, else fault_rate_plan(fault_rate).
std::string effective_faults(const ReplayConfig& c);

// Runs the replay; prints progress/summary to `out`, errors to `err`. Returns the exit code:
// 0 replay ran and is clean; 1 replay ran with problems (mismatched bytes, misattributed faults,
// unexpected failures, ...) or stopped early; 2 invalid options; 128+N stopped by signal N.
int run_replay(ReplayConfig config, std::ostream& out, std::ostream& err);

}  // namespace kvferry::replay
