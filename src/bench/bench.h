// `kvferry bench`: a pure transfer benchmark between a prefill and a decode engine, every rank its
// own process (`kvferry bench-rank`), no trace, no content generation or verification.
//
// What runs: the orchestrator (run_bench) starts a BootstrapServer in-process and spawns
// prefill_tp + decode_tp `kvferry bench-rank` processes. Each rank builds a caller-pumped
// kvferry::Manager (UCX shm/tcp + ZeroMQ control) and drives rooms only through the public
// Sender/Receiver (kvferry/manager.h), as an engine does; it touches its whole pool once (outside
// the timed region), connects, and writes DIR/ready-NAME.
// Once every rank is ready the orchestrator writes DIR/go ("start window_start window_end", ns of
// CLOCK_MONOTONIC, which every process on the machine shares). Then rooms 1, 2, 3, ... run with at
// most `concurrency` open per rank: decode opens room k (receiver(k), init, send_metadata with
// kv_indices from its page allocator) no earlier than start + (k-1)/rate; prefill opens it too
// (sender(k), init at once) and send()s all its pages in chunks of chunk_tokens, from a staging
// ring whose pages come back by Sender::take_completed_sends(), once it is WaitingForInput; both
// drop the handle at Success (decode keeps a quarantined room's pages until
// Manager::take_reclaimed_rooms() names it).
// Warm-up runs from start to window_start; the window [window_start, window_end) is measured.
// After window_end no new room is opened (prefill still opens rooms decode already sent metadata
// for), open rooms finish, and each rank writes DIR/NAME.json and exits.
//
// Measured per rank inside the window: CPU (getrusage RUSAGE_SELF, user+system, all threads), and
// RSS (/proc/self/status RssAnon: the pools are SysV shared memory, RssShmem, so they are apart).
// Bandwidth = bytes moved inside the window / the window. Each prefill rank's room contributes its
// bytes times the fraction of its transfer interval [that rank's first send(), its Success] that
// lies inside the window: the bytes are assumed to move at an even rate within a room's interval
// on a rank (a room's pages go out as a few large writes whose completions the rank does not time
// one by one). So rooms in flight at either edge count in part, and the figure is not quantized
// by whole rooms (with 512 MiB rooms finishing 4 at a time, whole rooms made a 5 s window count
// 8, 12 or 16 of them).
// `rooms`: rooms every prefill rank finished whose last prefill Success is inside the window.
// transfer latency (over those rooms) = last prefill rank's Success - first prefill rank's first
// send() (ms); room latency (over rooms whose last decode Success is inside the window) = last
// decode rank's Success - first decode rank's init() (metadata out; ms).
// Compute model (--prefill-ms-per-layer X, --layerwise): a prefill rank computes one room at a
// time, X ms per layer (a timed wait, not a spin), from when decode's metadata is there; without
// --layerwise it sends the whole room after the last layer, with it each layer as its compute
// ends (Sender::send with a LayerRange, kvferry/manager.h). transfer tail (per room, over rooms
// every decode rank finished inside the window) = last decode rank's Success - the end of the
// last layer's compute on the last prefill rank: what the user waits for after the forward pass.
// Every finished room's sample goes to a scratch file (DIR/NAME.samples, removed at exit) as it
// comes, so a rank's memory does not grow with the rooms it served; NAME.json lists them.
// Units: bytes, ns internally; JSON in ms, s, GB (10^9 bytes), KiB for RSS.
// Thread contract: run_bench() / run_bench_rank() on the process's main thread.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::bench {

struct BenchConfig {
  std::string model = "Llama-3.1-8B";
  std::string models_file;         // default: default_models_file() (core/data_dir.h)
  uint32_t layers = 0;             // 0: the model's; N: only the first N layers (control-plane mode)
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  uint64_t tokens = 4096;          // input tokens per request (room)
  uint32_t page_size = 64;         // tokens per page
  uint64_t chunk_tokens = 8192;    // tokens per prefill send()
  uint32_t concurrency = 4;        // rooms in flight per rank
  double rate = 0;                 // rooms/s opened by decode; 0: as fast as rooms complete
  std::string transport = "shm";   // shm | tcp
  uint32_t transfer_shards = 1;    // per rank (TransportOptions::shards)
  bool integrity = false;          // every rank's ManagerConfig::integrity
  // TransportOptions::tcp_congestion of every rank; "default": the host's (docs/transport.md).
  std::string tcp_congestion = "cubic";
  double duration_s = 5;           // measured window
  double warmup_s = -1;            // before the window; <0: min(1, duration / 5)
  uint64_t rss_checkpoint = 0;     // >0: each rank also records RssAnon after this many rooms
  // "sequential": each side's pages of a room as its page allocator hands them out (runs of
  // consecutive pages, coalesced into few writes); "random": both sides' page lists shuffled (seeded
  // by the room), as a long-running engine's fragmented pool gives them: one write per page per layer
  // buffer (docs/BENCHMARKS.md "Fragmented transfers").
  std::string page_order = "sequential";
  // The compute model (prefill_compute.h): each prefill rank "computes" a room's layers one after
  // the other, this long each (a timed wait), one room at a time; 0: no compute, rooms are sent
  // as soon as decode is ready.
  double prefill_ms_per_layer = 0;
  bool layerwise = false;          // send each layer as its compute ends, not the room after the last
  // "pool" (--memory host): each rank's KV in one pool kvferry allocates (over shm a UCX-mapped
  // region: a put is the writer's memcpy into the peer's mapping); "engine": one buffer per layer
  // tensor that the rank allocates itself and registers (ManagerConfig::buffers), as vLLM's
  // per-layer tensors are (over shm UCX cannot map such memory into the peer: writes go as UCX
  // messages copied by the receiver; docs/transport.md "Direct copies over shm", docs/vllm.md
  // "Throughput").
  std::string memory = "pool";
  std::string out;                 // JSON result path ("" : none)
  std::string work_dir;            // ready/go/rank files and rank logs; default: <out dir>/bench-work
  std::string exe;                 // kvferry executable for the ranks; default: this process's
  double timeout_s = 120;          // ranks must be ready within this, and finish within this after the window
};

struct BenchRankOptions {
  bool prefill = true;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint32_t peer_tp_size = 1;
  std::string model = "Llama-3.1-8B";
  std::string models_file;
  uint32_t layers = 0;
  uint64_t tokens = 4096;
  uint32_t page_size = 64;
  uint64_t chunk_tokens = 8192;
  uint32_t concurrency = 4;
  double rate = 0;
  std::string transport = "shm";
  uint32_t transfer_shards = 1;
  bool integrity = false;
  std::string tcp_congestion = "cubic";  // "default": the host's
  std::string bootstrap;           // host:port
  std::string dir;                 // work dir (ready/go files, NAME.json)
  uint64_t rss_checkpoint = 0;
  std::string page_order = "sequential";
  double prefill_ms_per_layer = 0;
  bool layerwise = false;
  std::string memory = "pool";     // BenchConfig::memory
  double timeout_s = 120;
};

// "prefill-tp0", "decode-tp3".
std::string rank_name(bool prefill, uint32_t tp_rank);
// The rank's argv (args[0] = exe).
std::vector<std::string> bench_rank_args(const BenchConfig& c, bool prefill, uint32_t tp_rank,
                                         const std::string& bootstrap, const std::string& dir);

// Checks the options and fills defaults. kInvalidArgument with a message for the user.
Status validate(BenchConfig& c);

// Runs the benchmark; prints a summary to `out`, errors to `err`. Returns 0 when it ran and every
// counted room succeeded, 1 when it ran but rooms failed or none finished, 2 on invalid options or
// when a rank could not start.
int run_bench(BenchConfig config, std::ostream& out, std::ostream& err);

// One rank (exit code: 0 ok, 2 could not start, 1 stopped early).
int run_bench_rank(const BenchRankOptions& o);

}  // namespace kvferry::bench
