#include "bench/summary.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace kvferry::bench {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

nlohmann::json latency_json(const std::vector<double>& ms) {
  double sum = 0;
  for (double x : ms) sum += x;
  return {{"p50", quantile(ms, 0.5)},
          {"p90", quantile(ms, 0.9)},
          {"p99", quantile(ms, 0.99)},
          {"max", quantile(ms, 1.0)},
          {"mean", ms.empty() ? 0.0 : sum / static_cast<double>(ms.size())},
          {"count", ms.size()}};
}

nlohmann::json cdf_points(std::vector<double> ms, size_t max_points) {
  std::sort(ms.begin(), ms.end());
  nlohmann::json out = nlohmann::json::array();
  if (ms.empty() || max_points == 0) return out;
  const size_t n = std::min(ms.size(), max_points);
  for (size_t i = 0; i < n; ++i) out.push_back(ms[n == 1 ? ms.size() - 1 : i * (ms.size() - 1) / (n - 1)]);
  return out;
}

namespace {
struct Merged {
  int64_t start = 0, end = 0;
  uint64_t bytes = 0;
  uint32_t ranks = 0;
};

void merge(std::map<uint64_t, Merged>& into, const nlohmann::json& rooms) {
  for (const auto& r : rooms) {
    Merged& m = into[r[0].get<uint64_t>()];
    int64_t s = r[1].get<int64_t>(), e = r[2].get<int64_t>();
    m.start = m.ranks == 0 ? s : std::min(m.start, s);
    m.end = std::max(m.end, e);
    m.bytes += r[3].get<uint64_t>();
    ++m.ranks;
  }
}
}  // namespace

nlohmann::json summarize(const std::vector<nlohmann::json>& ranks, uint32_t prefill_tp, uint32_t decode_tp,
                         double window_s) {
  std::map<uint64_t, Merged> sent, received;
  double cpu = 0;
  uint64_t failed = 0, open_at_exit = 0;
  nlohmann::json per_rank = nlohmann::json::array();
  for (const auto& r : ranks) {
    merge(r.at("role") == "prefill" ? sent : received, r.at("rooms"));
    cpu += r.at("cpu_s").get<double>();
    failed += r.at("failed").get<uint64_t>();
    open_at_exit += r.at("open_at_exit").get<uint64_t>();
    nlohmann::json pr = {{"name", r.at("name")},           {"cpu_s", r.at("cpu_s")},
                         {"rooms_total", r.at("rooms_total")}, {"rooms_before_window", r.at("rooms_before_window")},
                         {"rss_start", r.at("rss_start")},   {"rss_end", r.at("rss_end")},
                         {"pool_bytes", r.at("pool_bytes")}};
    if (r.contains("rss_checkpoint")) pr["rss_checkpoint"] = r["rss_checkpoint"];
    per_rank.push_back(std::move(pr));
  }
  std::vector<double> transfer_ms, room_ms;
  uint64_t bytes = 0, rooms = 0;
  for (const auto& [id, m] : sent) {
    if (m.ranks != prefill_tp) continue;
    ++rooms;
    bytes += m.bytes;
    transfer_ms.push_back(static_cast<double>(m.end - m.start) / 1e6);
  }
  for (const auto& [id, m] : received)
    if (m.ranks == decode_tp) room_ms.push_back(static_cast<double>(m.end - m.start) / 1e6);
  const double gb = static_cast<double>(bytes) / 1e9;
  nlohmann::json j;
  j["window_s"] = window_s;
  j["rooms"] = rooms;
  j["bytes"] = bytes;
  j["failed"] = failed;
  j["open_at_exit"] = open_at_exit;
  j["gb_per_s"] = window_s > 0 ? gb / window_s : 0.0;
  j["rooms_per_s"] = window_s > 0 ? static_cast<double>(rooms) / window_s : 0.0;
  j["transfer_latency_ms"] = latency_json(transfer_ms);
  j["transfer_latency_cdf_ms"] = cdf_points(transfer_ms, 500);
  j["room_latency_ms"] = latency_json(room_ms);
  j["cpu_s"] = cpu;
  j["cpu_s_per_gb"] = gb > 0 ? cpu / gb : 0.0;
  j["cpu_us_per_room"] = rooms > 0 ? cpu * 1e6 / static_cast<double>(rooms) : 0.0;
  j["ranks"] = std::move(per_rank);
  return j;
}

}  // namespace kvferry::bench
