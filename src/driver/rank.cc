#include "driver/rank.h"

#include <fmt/format.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "core/stop_request.h"
#include "driver/decode_driver.h"
#include "driver/engine_loop.h"
#include "driver/prefill_driver.h"
#include "endpoint/decode_endpoint.h"
#include "endpoint/prefill_endpoint.h"
#include "endpoint/topology.h"
#include "kvferry/bootstrap.h"
#include "kvferry/log.h"
#include "kvferry/metrics.h"
#include "kvferry/port_file.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "rank";

// MemAvailable from /proc/meminfo in bytes (0 if unknown).
uint64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

int fail_start(const std::string& what) {
  log_event(LogLevel::kCritical, kComp, "cannot start: " + what);
  flush_logging();
  return 2;
}
}  // namespace

int run_rank(const RankOptions& o) {
  RankId self{o.role, 0, o.tp_rank, o.dp_rank};
  init_logging({self.str(), o.log_file, LogLevel::kDebug, LogLevel::kWarning});
  init_rank_metrics(self);
  install_stop_handler();
  std::unique_ptr<MetricsServer> metrics_server;
  if (o.metrics_port != 0 || !o.metrics_port_file.empty()) {
    auto server = MetricsServer::start(*rank_metrics(), "127.0.0.1", o.metrics_port);
    if (!server.ok()) return fail_start(server.status().str());
    metrics_server = std::move(*server);
    if (!o.metrics_port_file.empty()) {
      Status s = write_port_file(o.metrics_port_file, metrics_server->port());
      if (!s.ok()) return fail_start("metrics port file: " + s.str());
    }
  }

  auto model = load_model_file(o.models_file, o.model);
  if (!model.ok()) return fail_start(model.status().str());
  if (o.page_size == 0) return fail_start("page size must be at least 1 token");
  auto layout = make_layout(*model, o.tp_size, o.tp_rank, o.page_size, o.pool_mib << 20, o.aux_slots);
  if (!layout.ok()) return fail_start(layout.status().str());
  uint32_t peer_tp = o.peer_tp_size ? o.peer_tp_size : o.tp_size;
  uint32_t prefill_tp = o.role == Role::kPrefill ? o.tp_size : peer_tp;
  uint32_t decode_tp = o.role == Role::kPrefill ? peer_tp : o.tp_size;
  auto plan = plan_transfers(*model, prefill_tp, decode_tp);
  if (!plan.ok()) return fail_start(plan.status().str());

  uint64_t avail = mem_available();
  if (avail != 0 && layout->total_bytes() > avail)
    return fail_start(fmt::format("a pool of {} MiB does not fit this machine ({} MiB available)", o.pool_mib,
                                  avail >> 20));

  EndpointConfig ec;
  ec.self = self;
  ec.layout = *layout;
  ec.transport = o.transport;
  ec.transfer_shards = o.transfer_shards;
  ec.deadlines = o.deadlines;
  auto core = EndpointCore::create(ec);
  if (!core.ok()) return fail_start(core.status().str());
  EndpointCore& c = **core;
  log_event(LogLevel::kDebug, kComp,
            fmt::format("pool: {} pages of {} tokens, {} buffers, {} bytes, transport {}", layout->num_pages,
                        layout->page_size, layout->num_buffers(), layout->total_bytes(), o.transport));

  BootstrapClient bootstrap(o.bootstrap, 2000);
  EngineLoopConfig lc{self, o.tp_size, o.engine_endpoint, o.router_endpoint};
  lc.peer_timeout_ms = o.deadlines.engine_timeout_ms;
  lc.port_file = o.port_file;
  int rc = 0;
  if (o.role == Role::kPrefill) {
    PrefillRankInfo info;
    info.tp_rank = o.tp_rank;
    info.dp_rank = o.dp_rank;
    info.tp_size = o.tp_size;
    info.host = "127.0.0.1";
    info.control_endpoint = c.control().endpoint();
    info.page_size = o.page_size;
    info.dtype = model->dtype_bytes == 2 ? "bfloat16" : fmt::format("{}-byte", model->dtype_bytes);
    info.model = model->name;
    info.num_layers = model->num_layers;
    info.heads_per_rank = layout->heads_per_rank;
    info.first_head = layout->first_head;
    Status s = bootstrap.register_rank(info);
    for (int64_t deadline = monotonic_ns() + o.deadlines.lookup_timeout_ms * 1'000'000; !s.ok() && monotonic_ns() < deadline;) {
      wait_readable(nullptr, 0, 50);
      s = bootstrap.register_rank(info);
    }
    if (!s.ok()) return fail_start("bootstrap registration: " + s.str());
    PrefillEndpoint ep(c, *plan, o.peer_dp_size);
    PrefillDriver driver(c, ep, {std::max<uint64_t>(1, o.chunk_tokens / o.page_size)});
    EngineLoop loop(
        lc, c, driver, [&](const Message& m) { ep.on_message(m); },
        [&](const TransportEvent& e) {
          if (auto done = ep.on_transport_event(e)) driver.on_chunk_done(*done);
        });
    rc = loop.run();
  } else {
    DecodeEndpoint ep(c, *plan, o.bootstrap, o.peer_dp_size);
    Status s = ep.connect_peers(bootstrap, monotonic_ns() + o.deadlines.lookup_timeout_ms * 1'000'000);
    if (!s.ok()) return fail_start(s.str());
    DecodeDriver driver(c, ep);
    EngineLoop loop(
        lc, c, driver, [&](const Message& m) { ep.on_message(m); }, [&](const TransportEvent&) {});
    rc = loop.run();
  }
  if (!o.metrics_file.empty()) {
    Status s = write_metrics_file(*rank_metrics(), o.metrics_file);
    if (!s.ok()) log_event(LogLevel::kWarning, kComp, "metrics file: " + s.str());
  }
  flush_logging();
  return rc;
}

}  // namespace kvferry
