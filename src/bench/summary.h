// Merges the ranks' result files of one `kvferry bench` run into the summary (bench.h).
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvferry/error.h"

namespace kvferry::bench {

// The q-quantile (0..1, nearest rank) of `v` (sorted here); 0 for an empty vector.
double quantile(std::vector<double> v, double q);
// {"p50","p90","p99","max","mean","count"} of `ms`.
nlohmann::json latency_json(const std::vector<double>& ms);

// At most `max_points` values of `ms`, sorted, evenly spaced in rank (first and last included):
// the points of a CDF plot.
nlohmann::json cdf_points(std::vector<double> ms, size_t max_points);

// The measured window [start_ns, end_ns), CLOCK_MONOTONIC ns (the times of the rank files).
struct Window {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// Bytes of one transfer interval [start_ns, end_ns] that fall inside `w`, assuming the bytes move
// at an even rate over the interval: bytes x overlap(interval, w) / (end_ns - start_ns). A
// zero-length interval (end_ns <= start_ns) counts whole when end_ns is in [w.start_ns, w.end_ns).
double bytes_in_window(uint64_t bytes, int64_t start_ns, int64_t end_ns, Window w);

// `ranks`: each rank's NAME.json (bench_rank.cc), whose "rooms" are [room, start_ns, end_ns, bytes,
// compute_end_ns (0: no compute model; absent in older files)] rows of every room the rank finished (Success), window or not.
// Returns window_s, gb_per_s, bytes, rooms, completed_bytes, rooms_per_s, failed, open_at_exit,
// transfer_latency_ms, transfer_latency_cdf_ms, room_latency_ms, cpu_s, cpu_s_per_gb,
// cpu_us_per_room, and per-rank cpu/rss:
// - bytes (gb_per_s = bytes / 1e9 / window_s): every prefill rank's rows contribute
//   bytes_in_window(bytes, first send, Success) of that rank, so a room in flight at an edge of the
//   window counts with the part of its interval inside it (rounded to whole bytes at the end);
// - rooms (rooms_per_s, cpu_us_per_room): rooms every prefill rank finished whose last prefill
//   Success is inside the window; completed_bytes are their whole KV bytes and transfer latency
//   (last Success - first send over the prefill ranks) covers them; room latency covers the rooms
//   every decode rank finished whose last decode Success is inside the window;
// - cpu_s_per_gb: cpu_s over the window per GB of `bytes`;
// - transfer_tail_ms (and transfer_tail_cdf_ms), only when prefill rows carry a fifth column, the
//   end of the room's last layer's compute (the compute model, bench.h): over the rooms of the
//   room latency that every prefill rank computed, last decode Success - latest compute end.
// kInvalidArgument when the window is empty (end_ns <= start_ns).
Result<nlohmann::json> summarize(const std::vector<nlohmann::json>& ranks, uint32_t prefill_tp, uint32_t decode_tp,
                                 Window window);

}  // namespace kvferry::bench
