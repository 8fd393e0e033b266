// `kvferry bench` orchestrator (bench.h).
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <thread>

#include "bench/bench.h"
#include "bench/summary.h"
#include "core/data_dir.h"
#include "endpoint/topology.h"
#include "kvferry/bootstrap.h"
#include "kvferry/geometry.h"
#include "kvferry/transport.h"
#include "process/host_memory.h"
#include "process/process.h"

namespace kvferry::bench {
namespace fs = std::filesystem;
namespace {

Status invalid(const std::string& m) { return Status(ErrorCode::kInvalidArgument, m); }

Result<ModelGeometry> load_model(const BenchConfig& c) {
  auto m = load_model_file(c.models_file, c.model);
  if (!m.ok()) return invalid(m.status().message());
  ModelGeometry g = *m;
  if (c.layers) g.num_layers = std::min(g.num_layers, c.layers);
  return g;
}

std::string num(double x) { return fmt::format("{}", x); }

}  // namespace

std::string rank_name(bool prefill, uint32_t tp_rank) {
  return fmt::format("{}-tp{}", prefill ? "prefill" : "decode", tp_rank);
}

std::vector<std::string> bench_rank_args(const BenchConfig& c, bool prefill, uint32_t tp_rank,
                                         const std::string& bootstrap, const std::string& dir) {
  return {c.exe,
          "bench-rank",
          "--role", prefill ? "prefill" : "decode",
          "--tp-rank", std::to_string(tp_rank),
          "--tp-size", std::to_string(prefill ? c.prefill_tp : c.decode_tp),
          "--peer-tp-size", std::to_string(prefill ? c.decode_tp : c.prefill_tp),
          "--model", c.model,
          "--models-file", c.models_file,
          "--layers", std::to_string(c.layers),
          "--tokens", std::to_string(c.tokens),
          "--page-size", std::to_string(c.page_size),
          "--chunk-tokens", std::to_string(c.chunk_tokens),
          "--concurrency", std::to_string(c.concurrency),
          "--rate", num(c.rate),
          "--transport", c.transport,
          "--transfer-shards", std::to_string(c.transfer_shards),
          "--tcp-congestion", c.tcp_congestion,
          "--integrity", c.integrity ? "true" : "false",
          "--bootstrap", bootstrap,
          "--dir", dir,
          "--rss-checkpoint", std::to_string(c.rss_checkpoint),
          "--page-order", c.page_order,
          "--prefill-ms-per-layer", num(c.prefill_ms_per_layer),
          "--layerwise", c.layerwise ? "true" : "false",
          "--memory", c.memory,
          "--timeout-s", num(c.timeout_s)};
}

Status validate(BenchConfig& c) {
  if (c.prefill_tp < 1 || c.prefill_tp > 16) return invalid("--prefill-tp must be in 1..16");
  if (c.decode_tp < 1 || c.decode_tp > 16) return invalid("--decode-tp must be in 1..16");
  if (c.page_size == 0) return invalid("--page-size must be > 0 tokens");
  if (c.page_order != "sequential" && c.page_order != "random")
    return invalid("--page-order must be sequential or random");
  if (c.memory != "pool" && c.memory != "engine") return invalid("memory must be pool (--memory host) or engine");
  if (c.tokens == 0) return invalid("--tokens must be > 0");
  if (c.chunk_tokens < c.page_size) return invalid("--chunk-tokens must be at least one page");
  if (c.concurrency < 1 || c.concurrency > 4096) return invalid("--concurrency must be in 1..4096");
  if (!(c.rate >= 0)) return invalid("--rate must be >= 0 rooms/s");
  if (Status st = check_transport_name(c.transport); !st.ok()) return invalid("--transport: " + st.message());
  if (c.transfer_shards < 1 || c.transfer_shards > kMaxTransportShards)
    return invalid(fmt::format("--transfer-shards must be in 1..{}", kMaxTransportShards));
  if (!(c.duration_s > 0) || c.duration_s > 3600) return invalid("--duration must be in (0, 3600] s");
  if (c.warmup_s < 0) c.warmup_s = std::min(1.0, c.duration_s / 5);
  if (!(c.timeout_s > 0)) return invalid("--timeout-s must be > 0");
  if (!(c.prefill_ms_per_layer >= 0) || c.prefill_ms_per_layer > 10'000)
    return invalid("--prefill-ms-per-layer must be in [0, 10000] ms");
  if (c.models_file.empty()) c.models_file = default_models_file();
  auto m = load_model(c);
  if (!m.ok()) return m.status();
  auto plan = plan_transfers(*m, c.prefill_tp, c.decode_tp);
  if (!plan.ok()) return invalid(plan.status().message());
  // Memory: every rank holds `concurrency` rooms of its share.
  uint64_t total = 0;
  for (int side = 0; side < 2; ++side) {
    uint32_t tp = side == 0 ? c.prefill_tp : c.decode_tp;
    for (uint32_t r = 0; r < tp; ++r) {
      auto l = make_layout(*m, tp, r, c.page_size, 1ull << 50, 64);
      if (!l.ok()) return invalid(l.status().message());
      total += l->bytes_for_pages(l->pages_for(c.tokens)) * c.concurrency;
    }
  }
  uint64_t avail = process::mem_available_bytes();
  if (avail && total > avail * 7 / 10)
    return invalid(fmt::format("the pools need {} MiB, more than 70% of the {} MiB available; lower "
                               "--tokens or --concurrency", total >> 20, avail >> 20));
  if (c.exe.empty()) c.exe = process::self_exe();
  if (c.work_dir.empty()) {
    fs::path base = c.out.empty() ? fs::path("out/bench") : fs::path(c.out).parent_path();
    if (base.empty()) base = ".";
    c.work_dir = (base / "bench-work").string();
  }
  return Status();
}

int run_bench(BenchConfig c, std::ostream& out, std::ostream& err) {
  Status v = validate(c);
  if (!v.ok()) {
    err << "kvferry bench: " << v.message() << "\n";
    return 2;
  }
  std::error_code ec;
  fs::remove_all(c.work_dir, ec);
  fs::create_directories(c.work_dir, ec);
  if (ec) {
    err << "kvferry bench: cannot create " << c.work_dir << ": " << ec.message() << "\n";
    return 2;
  }
  auto server = BootstrapServer::start(ListenAddress{});
  if (!server.ok()) {
    err << "kvferry bench: bootstrap service: " << server.status().str() << "\n";
    return 2;
  }
  const std::string bootstrap = (*server)->address();
  process::ProcessGroup group;
  std::vector<std::string> names;
  for (int side = 0; side < 2; ++side) {
    const bool prefill = side == 0;
    for (uint32_t r = 0; r < (prefill ? c.prefill_tp : c.decode_tp); ++r) {
      std::string name = rank_name(prefill, r);
      auto pid = group.spawn(name, c.exe, bench_rank_args(c, prefill, r, bootstrap, c.work_dir),
                             c.work_dir + "/" + name + ".stderr");
      if (!pid.ok()) {
        err << "kvferry bench: " << pid.status().str() << "\n";
        return 2;
      }
      names.push_back(name);
    }
  }
  auto fail_child = [&](const process::ChildExit& e) {
    err << "kvferry bench: " << e.name << " " << e.describe() << "; its output:\n"
        << process::tail_file(c.work_dir + "/" + e.name + ".stderr", 20);
    group.stop_all(std::chrono::milliseconds(500));
    return 2;
  };
  // Ready: every rank connected and its pool touched.
  const auto ready_deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(c.timeout_s);
  for (;;) {
    for (const auto& e : group.reap()) return fail_child(e);
    size_t ready = 0;
    for (const auto& n : names) ready += fs::exists(c.work_dir + "/ready-" + n);
    if (ready == names.size()) break;
    if (std::chrono::steady_clock::now() > ready_deadline) {
      err << "kvferry bench: ranks not ready within " << c.timeout_s << " s\n";
      return 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int64_t start = monotonic_ns() + 20'000'000;
  const int64_t window_start = start + static_cast<int64_t>(c.warmup_s * 1e9);
  const int64_t window_end = window_start + static_cast<int64_t>(c.duration_s * 1e9);
  {
    std::ofstream go(c.work_dir + "/go.tmp");
    go << start << " " << window_start << " " << window_end << "\n";
  }
  fs::rename(c.work_dir + "/go.tmp", c.work_dir + "/go", ec);
  // Finish: every rank exits on its own after the window.
  const auto finish_deadline = std::chrono::steady_clock::now() +
                               std::chrono::duration<double>(c.warmup_s + c.duration_s + c.timeout_s);
  while (group.running_count() > 0) {
    for (const auto& e : group.reap())
      if (!e.ok()) return fail_child(e);
    if (std::chrono::steady_clock::now() > finish_deadline) {
      err << "kvferry bench: ranks did not finish within " << c.timeout_s << " s after the window\n";
      group.stop_all(std::chrono::milliseconds(500));
      return 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<nlohmann::json> ranks;
  for (const auto& n : names) {
    std::ifstream f(c.work_dir + "/" + n + ".json");
    try {
      ranks.push_back(nlohmann::json::parse(f));
    } catch (const std::exception& e) {
      err << "kvferry bench: result of " << n << " unreadable: " << e.what() << "\n";
      return 2;
    }
  }
  auto summary = summarize(ranks, c.prefill_tp, c.decode_tp, Window{window_start, window_end});
  if (!summary.ok()) {
    err << "kvferry bench: " << summary.status().message() << "\n";
    return 2;
  }
  nlohmann::json& j = *summary;
  // The size of one coalesced write: a chunk's contiguous pages of one buffer, one head run.
  auto m = load_model(c);
  auto plan = plan_transfers(*m, c.prefill_tp, c.decode_tp);
  const uint64_t room_pages = (c.tokens + c.page_size - 1) / c.page_size;
  const uint64_t chunk_pages = std::min<uint64_t>(room_pages, std::max<uint64_t>(1, c.chunk_tokens / c.page_size));
  // Whole token rows on both sides (same heads per rank): a page run is one contiguous write.
  // Otherwise each token's head slice is its own write (tcp gathers or packs them; bench.h).
  uint64_t write_bytes = 0;
  if (!plan->empty()) {
    const HeadTransfer& t = plan->front();
    const uint64_t slice = uint64_t(t.num_heads) * m->head_dim * m->dtype_bytes;
    auto pl = make_layout(*m, c.prefill_tp, t.prefill_rank, c.page_size, 1ull << 30, 1);
    auto dl = make_layout(*m, c.decode_tp, t.decode_rank, c.page_size, 1ull << 30, 1);
    const bool whole_rows = pl.ok() && dl.ok() && slice == pl->token_bytes() && slice == dl->token_bytes();
    // Random page order: no two consecutive pages of a list are consecutive in the pool, so a
    // run is one page (a chance neighbour aside).
    const uint64_t run_pages = c.page_order == "random" ? 1 : chunk_pages;
    write_bytes = whole_rows ? run_pages * c.page_size * slice : slice;
    j["pieces_per_room_buffer"] = whole_rows ? room_pages / run_pages : room_pages * c.page_size;
  }
  j["write_bytes"] = write_bytes;
  j["buffers"] = m->num_layers * m->tensors_per_layer;  // KV buffers per rank (one per layer tensor)
  j["config"] = {{"model", c.model},         {"layers", m->num_layers},
                 {"prefill_tp", c.prefill_tp}, {"decode_tp", c.decode_tp},
                 {"tokens", c.tokens},       {"page_size", c.page_size},
                 {"chunk_tokens", c.chunk_tokens}, {"concurrency", c.concurrency},
                 {"rate", c.rate},           {"transport", c.transport},
                 {"transfer_shards", c.transfer_shards}, {"tcp_congestion", c.tcp_congestion},
                 {"duration_s", c.duration_s}, {"warmup_s", c.warmup_s},
                 {"rss_checkpoint", c.rss_checkpoint}, {"page_order", c.page_order},
                 {"prefill_ms_per_layer", c.prefill_ms_per_layer}, {"layerwise", c.layerwise},
                 {"memory", c.memory}, {"integrity", c.integrity}};
  const auto& tl = j["transfer_latency_ms"];
  out << fmt::format(
      "kvferry bench: {} {}+{} {} tokens/room, page {}, concurrency {}, {}{}: {:.3f} GB/s, {:.1f} rooms/s, "
      "transfer latency p50 {:.3f} ms p90 {:.3f} ms p99 {:.3f} ms, {:.3f} CPU s/GB, {:.1f} CPU us/room, "
      "{:.0f} writes/s, {:.0f} CPU ns/write, {:.2f} page faults/GB (worst rank), {} rooms, {} failed\n",
      c.model, c.prefill_tp, c.decode_tp, c.tokens, c.page_size, c.concurrency, c.transport,
      std::string(c.memory == "engine" ? ", engine buffers" : "") + (c.integrity ? " with integrity" : ""),
      j["gb_per_s"].get<double>(), j["rooms_per_s"].get<double>(), tl["p50"].get<double>(),
      tl["p90"].get<double>(), tl["p99"].get<double>(), j["cpu_s_per_gb"].get<double>(),
      j["cpu_us_per_room"].get<double>(), j["writes_per_s"].get<double>(), j["cpu_ns_per_write"].get<double>(),
      j["faults_per_gb"].get<double>(), j["rooms"].get<uint64_t>(),
      j["failed"].get<uint64_t>());
  if (j.contains("transfer_tail_ms"))
    out << fmt::format("kvferry bench: {} ms/layer of compute, {}: transfer tail (last layer's compute -> decode "
                       "Success) p50 {:.3f} ms p99 {:.3f} ms over {} rooms\n",
                       c.prefill_ms_per_layer, c.layerwise ? "layer-wise" : "whole room after the last layer",
                       j["transfer_tail_ms"]["p50"].get<double>(), j["transfer_tail_ms"]["p99"].get<double>(),
                       j["transfer_tail_ms"]["count"].get<uint64_t>());
  if (!c.out.empty()) {
    fs::path p(c.out);
    if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
    std::ofstream f(c.out);
    f << j.dump(2) << "\n";
    if (!f) {
      err << "kvferry bench: cannot write " << c.out << "\n";
      return 2;
    }
  }
  if (j["failed"].get<uint64_t>() > 0) {
    err << "kvferry bench: " << j["failed"].get<uint64_t>() << " rooms failed (exit 1)\n";
    return 1;
  }
  if (j["rooms"].get<uint64_t>() == 0) {
    err << "kvferry bench: no room completed inside the " << c.duration_s
        << " s window, so there are no latencies (exit 1); use a longer --duration or smaller rooms\n";
    return 1;
  }
  return 0;
}

}  // namespace kvferry::bench
