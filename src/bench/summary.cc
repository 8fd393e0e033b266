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

double bytes_in_window(uint64_t bytes, int64_t start_ns, int64_t end_ns, Window w) {
  if (end_ns <= start_ns) return end_ns >= w.start_ns && end_ns < w.end_ns ? static_cast<double>(bytes) : 0.0;
  const int64_t overlap = std::min(end_ns, w.end_ns) - std::max(start_ns, w.start_ns);
  if (overlap <= 0) return 0.0;
  return static_cast<double>(bytes) * (static_cast<double>(overlap) / static_cast<double>(end_ns - start_ns));
}

namespace {
struct Merged {
  int64_t start = 0, end = 0;
  uint64_t bytes = 0;
  uint32_t ranks = 0;
  int64_t compute_end = 0;  // prefill with the compute model: the latest end of the last layer's compute
};

void merge(std::map<uint64_t, Merged>& into, const nlohmann::json& rooms) {
  for (const auto& r : rooms) {
    Merged& m = into[r[0].get<uint64_t>()];
    int64_t s = r[1].get<int64_t>(), e = r[2].get<int64_t>();
    m.start = m.ranks == 0 ? s : std::min(m.start, s);
    m.end = m.ranks == 0 ? e : std::max(m.end, e);
    m.bytes += r[3].get<uint64_t>();
    if (r.size() > 4) m.compute_end = std::max(m.compute_end, r[4].get<int64_t>());
    ++m.ranks;
  }
}

bool inside(int64_t t, Window w) { return t >= w.start_ns && t < w.end_ns; }
}  // namespace

Result<nlohmann::json> summarize(const std::vector<nlohmann::json>& ranks, uint32_t prefill_tp, uint32_t decode_tp,
                                 Window window) {
  if (window.end_ns <= window.start_ns)
    return Status(ErrorCode::kInvalidArgument, "summarize: the measured window is empty");
  const double window_s = static_cast<double>(window.end_ns - window.start_ns) / 1e9;
  std::map<uint64_t, Merged> sent, received;
  double cpu = 0, window_bytes = 0;
  uint64_t failed = 0, open_at_exit = 0;
  nlohmann::json per_rank = nlohmann::json::array();
  for (const auto& r : ranks) {
    const bool prefill = r.at("role") == "prefill";
    merge(prefill ? sent : received, r.at("rooms"));
    if (prefill)
      for (const auto& row : r.at("rooms"))
        window_bytes += bytes_in_window(row[3].get<uint64_t>(), row[1].get<int64_t>(), row[2].get<int64_t>(), window);
    cpu += r.at("cpu_s").get<double>();
    failed += r.at("failed").get<uint64_t>();
    open_at_exit += r.at("open_at_exit").get<uint64_t>();
    nlohmann::json pr = {{"name", r.at("name")},           {"cpu_s", r.at("cpu_s")},
                         {"rooms_total", r.at("rooms_total")}, {"rooms_before_window", r.at("rooms_before_window")},
                         {"rss_start", r.at("rss_start")},   {"rss_end", r.at("rss_end")},
                         {"pool_bytes", r.at("pool_bytes")}};
    if (r.contains("rss_checkpoint")) pr["rss_checkpoint"] = r["rss_checkpoint"];
    for (const char* k : {"minor_faults", "major_faults", "locked_bytes", "unlocked_bytes", "residency_warnings", "writes",
                          "tcp_sockets_tuned", "tcp_congestion_failures"})
      if (r.contains(k)) pr[k] = r[k];
    per_rank.push_back(std::move(pr));
  }
  std::vector<double> transfer_ms, room_ms;
  uint64_t completed_bytes = 0, rooms = 0;
  for (const auto& [id, m] : sent) {
    if (m.ranks != prefill_tp || !inside(m.end, window)) continue;
    ++rooms;
    completed_bytes += m.bytes;
    transfer_ms.push_back(static_cast<double>(m.end - m.start) / 1e6);
  }
  std::vector<double> tail_ms;  // the compute model's transfer tail: last layer's compute -> decode Success
  bool compute_model = false;
  for (const auto& [id, m] : sent) compute_model |= m.compute_end != 0;
  for (const auto& [id, m] : received) {
    if (m.ranks != decode_tp || !inside(m.end, window)) continue;
    room_ms.push_back(static_cast<double>(m.end - m.start) / 1e6);
    auto s = sent.find(id);
    if (s != sent.end() && s->second.ranks == prefill_tp && s->second.compute_end != 0)
      tail_ms.push_back(static_cast<double>(m.end - s->second.compute_end) / 1e6);
  }
  const uint64_t bytes = static_cast<uint64_t>(std::llround(window_bytes));
  const double gb = static_cast<double>(bytes) / 1e9;
  nlohmann::json j;
  j["window_s"] = window_s;
  j["rooms"] = rooms;
  j["bytes"] = bytes;
  j["completed_bytes"] = completed_bytes;
  j["failed"] = failed;
  j["open_at_exit"] = open_at_exit;
  j["gb_per_s"] = gb / window_s;
  j["rooms_per_s"] = static_cast<double>(rooms) / window_s;
  j["transfer_latency_ms"] = latency_json(transfer_ms);
  j["transfer_latency_cdf_ms"] = cdf_points(transfer_ms, 500);
  j["room_latency_ms"] = latency_json(room_ms);
  if (compute_model) {
    j["transfer_tail_ms"] = latency_json(tail_ms);
    j["transfer_tail_cdf_ms"] = cdf_points(tail_ms, 500);
  }
  j["cpu_s"] = cpu;
  j["cpu_s_per_gb"] = gb > 0 ? cpu / gb : 0.0;
  j["cpu_us_per_room"] = rooms > 0 ? cpu * 1e6 / static_cast<double>(rooms) : 0.0;
  // Page faults per GB moved in the window, per rank and the worst rank (minor + major).
  double worst = 0;
  for (auto& pr : per_rank) {
    if (!pr.contains("minor_faults")) continue;
    const double f = pr["minor_faults"].get<double>() + pr["major_faults"].get<double>();
    pr["faults_per_gb"] = gb > 0 ? f / gb : 0.0;
    worst = std::max(worst, pr["faults_per_gb"].get<double>());
  }
  j["faults_per_gb"] = worst;
  // Transport operations (puts over shm, messages over tcp) in the window, over all ranks, and the
  // CPU each cost (all ranks' CPU over the window / writes).
  uint64_t writes = 0;
  for (const auto& r : ranks)
    if (r.contains("writes")) writes += r["writes"].get<uint64_t>();
  j["writes"] = writes;
  j["writes_per_s"] = static_cast<double>(writes) / window_s;
  j["cpu_ns_per_write"] = writes > 0 ? cpu * 1e9 / static_cast<double>(writes) : 0.0;
  j["ranks"] = std::move(per_rank);
  return j;
}

}  // namespace kvferry::bench
