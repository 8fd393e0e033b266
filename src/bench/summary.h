// Merges the ranks' result files of one `kvferry bench` run into the summary (bench.h).
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvferry::bench {

// The q-quantile (0..1, nearest rank) of `v` (sorted here); 0 for an empty vector.
double quantile(std::vector<double> v, double q);
// {"p50","p90","p99","max","mean","count"} of `ms`.
nlohmann::json latency_json(const std::vector<double>& ms);

// At most `max_points` values of `ms`, sorted, evenly spaced in rank (first and last included):
// the points of a CDF plot.
nlohmann::json cdf_points(std::vector<double> ms, size_t max_points);

// `ranks`: each rank's NAME.json (bench_rank.cc); `window_s`: the measured window.
// Returns gb_per_s, rooms_per_s, bytes, rooms, failed, transfer_latency_ms, room_latency_ms,
// transfer_latency_cdf_ms, cpu_s, cpu_s_per_gb, cpu_us_per_room, and per-rank cpu/rss. A room counts when every prefill
// rank reported it (its Success fell inside the window on each); room latency needs every decode
// rank too.
nlohmann::json summarize(const std::vector<nlohmann::json>& ranks, uint32_t prefill_tp, uint32_t decode_tp,
                         double window_s);

}  // namespace kvferry::bench
