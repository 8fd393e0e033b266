#include "driver/rank.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "core/stop_request.h"
#include "core/thread_priority.h"
#include "driver/decode_driver.h"
#include "driver/engine_loop.h"
#include "driver/prefill_driver.h"
#include "kvferry/log.h"
#include "kvferry/manager.h"
#include "kvferry/metrics.h"
#include "kvferry/net.h"
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

// Written as soon as the engine loop returns, before the loop, driver and manager are torn
// down: after SIGTERM the orchestrator's grace period covers the write, not the teardown.
void write_final_metrics(const RankOptions& o) {
  if (o.metrics_file.empty()) return;
  Status s = write_metrics_file(*rank_metrics(), o.metrics_file);
  if (!s.ok()) log_event(LogLevel::kWarning, kComp, "metrics file: " + s.str());
}

// The engine loop's niceness (KVFERRY_LOOP_NICE, -20..0; 0 leaves it alone; default kLoopNice).
// The loop thread relays failures (fan-out frames, statuses) and otherwise sleeps in poll; raised,
// it runs as soon as a frame wakes it instead of queueing behind the copies (transport threads,
// nice 5) and page filling (job workers, nice 10) of every rank on the host (docs/BENCHMARKS.md,
// "Failure path"). Only where the process may (root / CAP_SYS_NICE; core/thread_priority.h).
constexpr int kLoopNice = -5;
int loop_nice() {
  const char* v = std::getenv("KVFERRY_LOOP_NICE");
  if (v == nullptr || *v == '\0') return kLoopNice;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n >= -20 && n <= 0) ? static_cast<int>(n) : kLoopNice;
}

int fail_start(const std::string& what) {
  log_event(LogLevel::kCritical, kComp, "cannot start: " + what);
  flush_logging();
  return 2;
}
// The router's "leave" (the replay's --scale; engine_protocol.h): after the engine loop and its
// driver ended (every room released), the rank leaves in order (kvferry/manager.h leave(),
// drained()); the manager's destructor then sends the leaving heartbeat, and the peers forget
// this rank without a failure.
void leave_in_order(Manager& m, int64_t timeout_ms) {
  if (Status st = m.leave(); !st.ok()) log_event(LogLevel::kWarning, kComp, "leave: " + st.str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 1000));
  while (!m.drained() && std::chrono::steady_clock::now() < deadline) {
    m.progress();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (m.drained()) {
    log_event(LogLevel::kInfo, kComp, "left in order (drained)");
  } else {
    log_event(LogLevel::kWarning, kComp, fmt::format("not drained within {} ms of leave(); leaving anyway", timeout_ms));
  }
}

}  // namespace

int run_rank(const RankOptions& o) {
  RankId self{o.role, o.role == Role::kDecode ? o.instance : 0, o.tp_rank, o.dp_rank};
  // Logged under its instance's name (xPyD): "prefill1/tp0" for prefill instance 1, whose ranks
  // are engine 0 in the library (child_args.h rank_name()).
  const RankId named{o.role, o.instance, o.tp_rank, o.dp_rank};
  init_logging({named.str(), o.log_file, LogLevel::kDebug, LogLevel::kWarning});
  init_rank_metrics(self);
  install_stop_handler();
  const ListenAddress listen = make_listen_address(o.bind_host, o.advertise_host);
  std::unique_ptr<MetricsServer> metrics_server;
  if (o.metrics_port != 0 || !o.metrics_port_file.empty()) {
    auto server = MetricsServer::start(*rank_metrics(), listen.bind_host, o.metrics_port);
    if (!server.ok()) return fail_start(server.status().str());
    metrics_server = std::move(*server);
    if (!o.metrics_port_file.empty()) {
      Status s = write_port_file(o.metrics_port_file, metrics_server->port());
      if (!s.ok()) return fail_start("metrics port file: " + s.str());
    }
  }

  auto model = load_model_file(o.models_file, o.model);
  if (!model.ok()) return fail_start(model.status().str());
  const uint64_t pool_bytes = o.pool_mib << 20;
  uint64_t avail = mem_available();
  if (avail != 0 && pool_bytes > avail)
    return fail_start(fmt::format("a pool of {} MiB does not fit this machine ({} MiB available)", o.pool_mib,
                                  avail >> 20));

  // The rank is one caller-pumped Manager; the engine loop pumps it.
  ManagerConfig mc;
  mc.self = self;
  mc.tp_size = o.tp_size;
  mc.peer_tp_size = o.peer_tp_size;
  mc.peer_dp_size = o.peer_dp_size;
  mc.model = *model;
  mc.page_size = o.page_size;
  mc.pool_bytes = pool_bytes;
  mc.aux_rows = o.aux_slots;
  mc.bootstrap_address = o.bootstrap;
  mc.transport = o.transport;
  mc.transfer_shards = o.transfer_shards;
  mc.integrity = o.integrity;
  mc.deadlines = o.deadlines;
  mc.progress_thread = false;
  mc.control = listen;
  mc.control.port = o.control_port;
  mc.fault_injection = true;  // the replay harness's fault plans (transfer faults)
  auto manager = Manager::create(mc);
  if (!manager.ok()) return fail_start(manager.status().str());
  Manager& m = **manager;
  if (!o.control_port_file.empty()) {
    Status s = write_port_file(o.control_port_file, endpoint_port(m.control_endpoint()).value_or(0));
    if (!s.ok()) return fail_start("control port file: " + s.str());
  }

  EngineLoopConfig lc{self, o.tp_size, o.engine_endpoint, o.router_endpoint};
  lc.instance = o.instance;
  lc.peer_timeout_ms = o.deadlines.engine_timeout_ms;
  lc.port_file = o.port_file;
  lc.follower_port = o.engine_port;
  lc.bind_host = o.bind_host;
  lc.advertise_host = o.advertise_host;
  int rc = 0;
  bool leaving = false;  // the router's "leave": leave in order once the driver is gone
  // After the manager's threads started (they inherit the creator's niceness; each sets its own).
  if (const int n = loop_nice(); n < 0) (void)raise_thread_priority(0, n);
  if (o.role == Role::kPrefill) {
    PrefillDriverConfig pc;
    pc.chunk_pages = std::max<uint64_t>(1, o.chunk_tokens / std::max<uint32_t>(1, o.page_size));
    pc.ms_per_layer = o.prefill_ms_per_layer;
    pc.layerwise = o.layerwise;
    pc.fault_timeout_ms = o.deadlines.fault_timeout_ms;
    PrefillDriver driver(m, pc);
    EngineLoop loop(lc, m, driver);
    rc = loop.run();
    leaving = rc == 0 && loop.leaving();
    write_final_metrics(o);
  } else {
    DecodeDriver driver(m, {.tp_size = o.tp_size,
                            .prealloc_timeout_ms = o.deadlines.prealloc_timeout_ms,
                            .fault_timeout_ms = o.deadlines.fault_timeout_ms});
    EngineLoop loop(lc, m, driver);
    rc = loop.run();
    leaving = rc == 0 && loop.leaving();
    write_final_metrics(o);
  }
  if (leaving) leave_in_order(m, o.deadlines.engine_timeout_ms);
  flush_logging();
  return rc;
}

}  // namespace kvferry
