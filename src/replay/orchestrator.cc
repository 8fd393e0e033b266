// `kvferry replay` orchestration (orchestrator.h): validate, spawn, supervise, report.
#include "replay/orchestrator.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/data_dir.h"
#include "kvferry/control.h"
#include "endpoint/topology.h"
#include "kvferry/geometry.h"
#include "kvferry/net.h"
#include "kvferry/port_file.h"
#include "kvferry/trace.h"
#include "kvferry/transport.h"
#include "process/host_memory.h"
#include "process/process.h"
#include "replay/peer_death_frames.h"
#include "replay/progress.h"
#include "replay/report.h"
#include "replay/results.h"

namespace kvferry::replay {
using process::ChildExit;
using process::mem_available_bytes;
using process::meminfo_bytes;
using process::ProcessGroup;
using process::self_exe;
using process::tail_file;
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

// SIGINT/SIGTERM set g_signal while alive; the previous handlers come back on destruction.
class SignalGuard {
 public:
  SignalGuard() {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalGuard() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

Status invalid(std::string msg) { return {ErrorCode::kInvalidArgument, std::move(msg)}; }

std::string read_file(const std::string& path, bool& ok) {
  std::ifstream in(path, std::ios::binary);
  ok = static_cast<bool>(in);
  std::stringstream ss;
  if (ok) ss << in.rdbuf();
  return ss.str();
}

// Writes PATH.tmp, then renames it to PATH: a reader (a scraper reading metrics.json while the
// replay runs) never sees a partial file.
Status write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return {ErrorCode::kInternal, "cannot write " + tmp};
    out << text << "\n";
    if (!out.flush()) return {ErrorCode::kInternal, "cannot write " + tmp};
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return {ErrorCode::kInternal, "cannot rename " + tmp + " to " + path + ": " + ec.message()};
  return Status::Ok();
}

std::string num(double v) { return fmt::format("{}", v); }

std::string logs_dir(const ReplayConfig& c) { return c.out + "/logs"; }

// One child process: file name (logs/<file>.stderr) and the name users read.
struct ChildInfo {
  std::string file;     // "decode-tp1"
  std::string display;  // "decode/tp1"
};

std::string display_name(const std::vector<ChildInfo>& kids, const std::string& file) {
  for (const auto& k : kids) {
    if (k.file == file) return k.display;
  }
  return file;
}

// Removes what a previous replay into the same directory left (logs are counted by glob).
void clean_previous(const ReplayConfig& c) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(logs_dir(c), ec)) {
    const auto ext = e.path().extension();
    if (ext == ".jsonl" || ext == ".stderr" || ext == ".killed-tail" || ext == ".port" || ext == ".tmp") {
      fs::remove(e.path(), ec);
    }
  }
  fs::remove(c.out + "/report.json", ec);
  fs::remove(c.out + "/results.json", ec);
  fs::remove(c.out + "/results.json.progress", ec);
}

// A SIGKILLed process may leave half a line at the end of its JSON log (its buffered writes stop
// mid-line). Before the restarted process appends to the file, that fragment is moved to
// `<log>.killed-tail` (not scanned as a log), so every line stays one JSON object. Returns the
// number of bytes moved.
uint64_t set_aside_partial_line(const std::string& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size == 0) return 0;
  std::ifstream in(path, std::ios::binary);
  const uint64_t window = std::min<uint64_t>(size, 1 << 20);
  in.seekg(std::streamoff(size - window));
  std::string tail(window, '\0');
  in.read(tail.data(), std::streamsize(window));
  if (!in || tail.back() == '\n') return 0;
  const size_t nl = tail.rfind('\n');
  const uint64_t keep = nl == std::string::npos ? size - window : size - window + nl + 1;
  std::ofstream aside(path + ".killed-tail", std::ios::binary | std::ios::app);
  aside << tail.substr(nl == std::string::npos ? 0 : nl + 1) << "\n";
  fs::resize_file(path, keep, ec);
  return ec ? 0 : size - keep;
}

}  // namespace

std::string ReplayConfig::to_json() const {
  nlohmann::ordered_json j = {{"trace", trace},
                      {"model", model},
                      {"models_file", models_file},
                      {"prefill_tp", prefill_tp},
                      {"decode_tp", decode_tp},
                      {"prefill_dp", prefill_dp},
                      {"decode_dp", decode_dp},
                      {"page_size", page_size},
                      {"pool_mib", pool_mib},
                      {"pool_mib_auto", pool_mib_auto},
                      {"prefill_pool_mib", prefill_pool_mib},
                      {"chunk_tokens", chunk_tokens},
                      {"max_requests", max_requests},
                      {"time_scale", time_scale},
                      {"fault_rate", fault_rate},
                      {"faults", effective_faults(*this)},
                      {"restart_delay_ms", restart_delay_ms},
                      {"seed", seed},
                      {"transport", transport},
                      {"transfer_shards", transfer_shards},
                      {"max_inflight", max_inflight},
                      {"out", out},
                      {"ready_timeout_s", ready_timeout_s},
                      {"request_timeout_s", request_timeout_s},
                      {"timeout_s", timeout_s},
                      {"test_break_rank", break_rank},
                      {"metrics", metrics}};
  nlohmann::ordered_json d = nlohmann::ordered_json::object();
  for (const DeadlineField& f : deadline_fields()) {
    std::string key = f.option + 2;  // "--bootstrap-timeout-ms" -> "bootstrap_timeout_ms"
    std::replace(key.begin(), key.end(), '-', '_');
    d[key] = deadlines.*f.member;
  }
  j["deadlines"] = d;
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

uint64_t default_pool_mib(uint64_t mem_available_bytes, uint32_t prefill_tp,
                          uint64_t prefill_pool_mib, uint32_t decode_tp) {  // ranks, not TP
  const uint64_t budget_mib = mem_available_bytes / (1024 * 1024) * 6 / 10;
  const uint64_t staging = uint64_t(prefill_tp) * prefill_pool_mib;
  const uint64_t left = budget_mib > staging ? budget_mib - staging : 0;
  const uint64_t per_rank = left / std::max<uint32_t>(1, decode_tp);
  return std::clamp<uint64_t>(per_rank, 64, 7168);
}

Status validate(ReplayConfig& c) {
  if (c.trace.empty()) return invalid("--trace is required");
  if (c.prefill_tp < 1 || c.prefill_tp > 64) return invalid("--prefill-tp must be in 1..64");
  if (c.decode_tp < 1 || c.decode_tp > 64) return invalid("--decode-tp must be in 1..64");
  if (c.prefill_dp < 1 || c.prefill_dp > 16) return invalid("--prefill-dp must be in 1..16");
  if (c.decode_dp < 1 || c.decode_dp > 16) return invalid("--decode-dp must be in 1..16");
  const uint32_t prefill_ranks = c.prefill_tp * c.prefill_dp;
  const uint32_t decode_ranks = c.decode_tp * c.decode_dp;
  if (c.page_size == 0) return invalid("--page-size must be > 0 tokens");
  if (c.chunk_tokens == 0) return invalid("--chunk-tokens must be > 0");
  if (c.prefill_pool_mib == 0) return invalid("--prefill-pool-mib must be > 0");
  if (!(c.time_scale >= 0)) return invalid("--time-scale must be >= 0");
  if (!(c.fault_rate >= 0 && c.fault_rate <= 1)) return invalid("--fault-rate must be in [0, 1]");
  if (c.fault_rate > 0 && !c.faults.empty()) {
    return invalid("--fault-rate is a shorthand for a --faults plan: give one of them, not both");
  }
  {
    auto plan = parse_fault_plan(effective_faults(c), c.prefill_tp, c.decode_tp, c.prefill_dp,
                                 c.decode_dp);
    if (!plan.ok()) return invalid(plan.status().message());
    c.fault_plan = *plan;
  }
  if (c.restart_delay_ms < 0) return invalid("--restart-delay-ms must be >= 0");
  for (const DeadlineField& f : deadline_fields()) {
    if (c.deadlines.*f.member <= 0) {
      return invalid(fmt::format("{} must be > 0 ms, got {}", f.option, c.deadlines.*f.member));
    }
  }
  if (Status st = check_transport_name(c.transport); !st.ok()) {
    return invalid("--transport: " + st.message());
  }
  if (c.transfer_shards < 1 || c.transfer_shards > kMaxTransportShards) {
    return invalid(fmt::format("--transfer-shards must be in 1..{}, got {}", kMaxTransportShards,
                               c.transfer_shards));
  }
  if (c.max_inflight < 1) return invalid("--max-inflight must be >= 1");
  if (c.out.empty()) return invalid("--out must not be empty");
  if (!(c.ready_timeout_s > 0) || !(c.request_timeout_s > 0) || !(c.timeout_s > 0)) {
    return invalid("timeouts must be > 0");
  }

  auto trace = load_trace(c.trace, c.max_requests);
  if (!trace.ok()) return invalid("trace " + c.trace + ": " + trace.status().message());
  if (trace->empty()) return invalid("trace " + c.trace + " has no requests");
  size_t once = 0;
  for (const auto& item : c.fault_plan.items) once += item.once && item.kind != "peer_death";
  if (once > trace->size()) {
    return invalid(fmt::format("--faults has {} 'once' room faults but the replay has only {} requests",
                               once, trace->size()));
  }
  if (c.fault_plan.has_peer_death() && trace->size() < 2) {
    return invalid("peer_death needs at least 2 requests (the kill happens while rooms are in flight)");
  }

  if (c.models_file.empty()) c.models_file = default_models_file();
  bool ok = false;
  const std::string models_text = read_file(c.models_file, ok);
  if (!ok) return invalid("cannot read the models file " + c.models_file);
  auto models = parse_models_json(models_text);
  if (!models.ok()) return invalid("models file " + c.models_file + ": " + models.status().message());
  auto model = find_model(*models, c.model);
  if (!model.ok()) return invalid(model.status().message());

  if (c.pool_mib == 0) {
    c.pool_mib = default_pool_mib(mem_available_bytes(), prefill_ranks, c.prefill_pool_mib,
                                  decode_ranks);
    c.pool_mib_auto = true;
  }
  // The same layout check the ranks make: each pool must hold at least one page per buffer.
  for (auto [tp, mib, what] : {std::tuple{c.prefill_tp, c.prefill_pool_mib, "--prefill-pool-mib"},
                               std::tuple{c.decode_tp, c.pool_mib, "--pool-mib"}}) {
    auto layout = make_layout(*model, tp, 0, c.page_size, mib * 1024 * 1024, 1);
    if (!layout.ok()) {
      return invalid(fmt::format("{} {} with --page-size {} for {} at TP {}: {}", what, mib,
                                 c.page_size, c.model, tp, layout.status().message()));
    }
  }
  // Pools larger than the machine can never be backed; refuse them here rather than let a rank
  // thrash and be OOM-killed (other processes with it).
  const uint64_t want_mib = uint64_t(prefill_ranks) * c.prefill_pool_mib + uint64_t(decode_ranks) * c.pool_mib;
  const uint64_t total = meminfo_bytes("MemTotal");
  if (total > 0 && want_mib * 1024 * 1024 > total) {
    return invalid(fmt::format("the pools need {} MiB ({} x --prefill-pool-mib {} + {} x --pool-mib {}) "
                               "but this machine has {} MiB of memory",
                               want_mib, prefill_ranks, c.prefill_pool_mib, decode_ranks, c.pool_mib,
                               total / (1024 * 1024)));
  }
  if (!c.break_rank.empty()) {
    auto r = RankId::parse(c.break_rank);
    if (!r || r->engine_id != 0 ||
        r->dp_rank >= (r->role == Role::kPrefill ? c.prefill_dp : c.decode_dp) ||
        r->tp_rank >= (r->role == Role::kPrefill ? c.prefill_tp : c.decode_tp)) {
      return invalid("--test-break-rank must name a rank of this replay, got '" + c.break_rank + "'");
    }
  }
  if (c.exe.empty()) c.exe = self_exe();
  std::error_code ec;
  c.out = fs::absolute(c.out, ec).lexically_normal().string();
  if (!c.out.empty() && c.out.back() == '/') c.out.pop_back();
  return Status::Ok();
}

std::string rank_name(bool prefill, uint32_t tp_rank, uint32_t dp_rank) {
  return RankId{prefill ? Role::kPrefill : Role::kDecode, 0, tp_rank, dp_rank}.str();
}

std::string rank_file(bool prefill, uint32_t tp_rank, uint32_t dp_rank) {
  std::string f = rank_name(prefill, tp_rank, dp_rank);
  std::replace(f.begin(), f.end(), '/', '-');
  return f;
}

std::vector<std::string> bootstrap_args(const ReplayConfig& c, const Ports& p) {
  std::vector<std::string> args = {c.exe,  "bootstrap", "--host", std::string(kDefaultHost), "--port",
                                   std::to_string(p.bootstrap), "--log-file",
                                   logs_dir(c) + "/bootstrap.jsonl"};
  if (p.bootstrap == 0) {
    args.push_back("--port-file");
    args.push_back(logs_dir(c) + "/bootstrap.port");
  }
  return args;
}

std::vector<std::string> rank_args(const ReplayConfig& c, const Ports& p, bool prefill,
                                   uint32_t tp_rank, uint32_t dp_rank) {
  const std::string role = prefill ? "prefill" : "decode";
  const uint32_t tp = prefill ? c.prefill_tp : c.decode_tp;
  const auto& engines = prefill ? p.prefill_engines : p.decode_engines;
  const uint16_t engine_port = dp_rank < engines.size() ? engines[dp_rank] : 0;
  const std::string file = rank_file(prefill, tp_rank, dp_rank);
  const bool broken = c.break_rank == rank_name(prefill, tp_rank, dp_rank);
  std::vector<std::string> args = {c.exe,
          "rank",
          "--role", role,
          "--tp-rank", std::to_string(tp_rank),
          "--tp-size", std::to_string(tp),
          "--peer-tp-size", std::to_string(prefill ? c.decode_tp : c.prefill_tp),
          "--model", c.model,
          "--models-file", c.models_file,
          "--page-size", broken ? "0" : std::to_string(c.page_size),
          "--pool-mib", std::to_string(prefill ? c.prefill_pool_mib : c.pool_mib),
          "--bootstrap", host_port(kDefaultHost, p.bootstrap),
          "--engine-endpoint", zmq_endpoint(kDefaultHost, engine_port),
          "--router-endpoint", zmq_endpoint(kDefaultHost, p.router),
          "--transport", c.transport,
          "--log-file", fmt::format("{}/{}.jsonl", logs_dir(c), file),
          "--chunk-tokens", std::to_string(c.chunk_tokens)};
  if (c.transfer_shards != 1) {  // the rank's default is 1
    args.push_back("--transfer-shards");
    args.push_back(std::to_string(c.transfer_shards));
  }
  const uint32_t peer_dp = prefill ? c.decode_dp : c.prefill_dp;
  if (dp_rank != 0 || peer_dp != 1) {
    for (std::string a : {std::string("--dp-rank"), std::to_string(dp_rank),
                          std::string("--peer-dp-size"), std::to_string(peer_dp)}) {
      args.push_back(std::move(a));
    }
  }
  if (tp_rank == 0 && engine_port == 0) {
    args.push_back("--port-file");
    args.push_back(fmt::format("{}/{}.port", logs_dir(c), file));
  }
  for (std::string& a : deadline_args(c.deadlines)) args.push_back(std::move(a));
  if (c.metrics) {
    args.insert(args.end(), {"--metrics-port-file", fmt::format("{}/metrics/{}.port", c.out, file),
                             "--metrics-file", fmt::format("{}/metrics/{}.prom", c.out, file)});
  }
  return args;
}

std::string effective_faults(const ReplayConfig& c) {
  return c.faults.empty() ? fault_rate_plan(c.fault_rate).str() : c.faults;
}

std::vector<std::string> router_args(const ReplayConfig& c, const Ports& p) {
  std::vector<std::string> args = {c.exe,
          "router",
          "--trace", c.trace,
          "--max-requests", std::to_string(c.max_requests),
          "--time-scale", num(c.time_scale),
          "--seed", std::to_string(c.seed),
          "--prefill-tp", std::to_string(c.prefill_tp),
          "--decode-tp", std::to_string(c.decode_tp),
          "--prefill-dp", std::to_string(c.prefill_dp),
          "--decode-dp", std::to_string(c.decode_dp),
          "--endpoint", zmq_endpoint(kDefaultHost, p.router),
          "--max-inflight", std::to_string(c.max_inflight),
          "--results", c.out + "/results.json",
          "--log-file", logs_dir(c) + "/router.jsonl",
          "--ready-timeout-s", num(c.ready_timeout_s),
          "--request-timeout-s", num(c.request_timeout_s)};
  if (const std::string faults = effective_faults(c); !faults.empty()) {
    args.push_back("--faults");
    args.push_back(faults);
  }
  if (p.router == 0) {
    args.push_back("--port-file");
    args.push_back(logs_dir(c) + "/router.port");
  }
  // The leaders' engine endpoints reach the router in their "ready" frames.
  if (p.orchestrator != 0) {
    args.push_back("--orchestrator");
    args.push_back(zmq_endpoint(kDefaultHost, p.orchestrator));
  }
  return args;
}

namespace {

// One replay run after validation; owns the children.
class Run {
 public:
  Run(const ReplayConfig& c, std::ostream& out, std::ostream& err)
      : c_(c), out_(out), err_(err), t0_(Clock::now()) {}

  int go() {
    std::error_code ec;
    fs::create_directories(logs_dir(c_), ec);
    if (ec) return early_error("cannot create " + logs_dir(c_) + ": " + ec.message(), false);
    clean_previous(c_);
    SignalGuard signals;
    Ports p;
    if (c_.fault_plan.has_peer_death()) {
      auto sock = ControlSocket::bind(ListenAddress{});
      if (!sock.ok()) return early_error("cannot bind the orchestrator's socket: " + sock.status().str(), false);
      control_ = std::move(*sock);
      p.orchestrator = endpoint_port(control_->endpoint()).value_or(0);
    }
    if (c_.metrics) {
      if (int rc = setup_metrics(); rc != 0) return rc;
    }

    out_ << fmt::format("replay: {} requests of {} at prefill TP {} x DP {} / decode TP {} x DP {}, "
                        "{} transport, decode pool {} MiB/rank{}\n",
                        c_.max_requests == 0 ? std::string("all") : std::to_string(c_.max_requests),
                        c_.model, c_.prefill_tp, c_.prefill_dp, c_.decode_tp, c_.decode_dp,
                        c_.transport, c_.pool_mib, c_.pool_mib_auto ? " (automatic)" : "");
    out_ << "replay: logs in " << logs_dir(c_) << "\n" << std::flush;

    // Every listening child binds port 0 and reports its port (Ports, orchestrator.h). The
    // bootstrap service and the router listen before any rank starts, so the ranks' first
    // registration and "ready" frame find them; each DP group's leader before its followers.
    if (int rc = spawn("bootstrap", "bootstrap", bootstrap_args(c_, p)); rc != 0) return rc;
    if (int rc = wait_port("bootstrap", p.bootstrap); rc != 0) return rc;
    if (int rc = spawn("router", "router", router_args(c_, p)); rc != 0) return rc;
    if (int rc = wait_port("router", p.router); rc != 0) return rc;
    if (control_) router_endpoint_ = zmq_endpoint(kDefaultHost, p.router);
    for (bool prefill : {true, false}) {
      const uint32_t tp = prefill ? c_.prefill_tp : c_.decode_tp;
      const uint32_t dp = prefill ? c_.prefill_dp : c_.decode_dp;
      auto& engines = prefill ? p.prefill_engines : p.decode_engines;
      for (uint32_t g = 0; g < dp; ++g) {
        if (int rc = spawn(rank_file(prefill, 0, g), rank_name(prefill, 0, g),
                           rank_args(c_, p, prefill, 0, g));
            rc != 0) {
          return rc;
        }
      }
      engines.assign(dp, 0);
      for (uint32_t g = 0; g < dp; ++g) {
        const std::string leader = rank_file(prefill, 0, g);
        if (int rc = wait_port(leader, engines[g]); rc != 0) return rc;
        // A restarted leader (peer death) binds the same port: its followers know only that one.
        args_[leader] = rank_args(c_, p, prefill, 0, g);
      }
      for (uint32_t g = 0; g < dp; ++g) {
        for (uint32_t r = 1; r < tp; ++r) {
          if (int rc = spawn(rank_file(prefill, r, g), rank_name(prefill, r, g),
                             rank_args(c_, p, prefill, r, g));
              rc != 0) {
            return rc;
          }
        }
      }
    }
    if (c_.metrics) {
      if (int rc = wait_metrics_ports(); rc != 0) return rc;
    }
    if (int rc = supervise(); rc != 0) return rc;
    finish_processes();
    return report();
  }

 private:
  double elapsed_s() const {
    return std::chrono::duration<double>(Clock::now() - t0_).count();
  }

  // --metrics (docs/metrics.md): every rank of every DP group binds its metrics server to port 0
  // and writes the port to DIR/metrics/<file>.port. DIR/metrics.json names every rank's port file
  // and final file before any rank starts ("port" and "url" null), and is rewritten with each
  // rank's port and URL once every port file exists, and again when a restarted rank (peer death)
  // reports its new port.
  std::string metrics_dir() const { return c_.out + "/metrics"; }
  std::string metrics_port_file(const std::string& file) const { return metrics_dir() + "/" + file + ".port"; }

  int setup_metrics() {
    std::error_code ec;
    fs::remove_all(metrics_dir(), ec);
    fs::create_directories(metrics_dir(), ec);
    if (ec) return early_error("cannot create " + metrics_dir() + ": " + ec.message(), false);
    for (bool prefill : {true, false}) {
      for (uint32_t g = 0; g < (prefill ? c_.prefill_dp : c_.decode_dp); ++g) {
        for (uint32_t r = 0; r < (prefill ? c_.prefill_tp : c_.decode_tp); ++r) {
          metrics_ranks_.emplace_back(rank_name(prefill, r, g), rank_file(prefill, r, g));
        }
      }
    }
    if (Status st = write_metrics_json(); !st.ok()) return early_error(st.message(), false);
    return 0;
  }

  // Writes DIR/metrics.json from the port files there now; all_ports_: every rank has one.
  Status write_metrics_json() {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    all_ports_ = true;
    for (const auto& [name, file] : metrics_ranks_) {
      const std::string port_file = metrics_port_file(file);
      const auto port = read_port_file(port_file);
      all_ports_ = all_ports_ && port.has_value();
      j[name] = {{"url", port ? nlohmann::ordered_json("http://" + host_port(kDefaultHost, *port) + "/metrics")
                              : nlohmann::ordered_json(nullptr)},
                 {"port", port ? nlohmann::ordered_json(*port) : nlohmann::ordered_json(nullptr)},
                 {"port_file", port_file},
                 {"final", fmt::format("{}/{}.prom", metrics_dir(), file)}};
    }
    return write_file(c_.out + "/metrics.json", j.dump(2));
  }

  // After every rank started: waits for every metrics port file, then rewrites metrics.json.
  int wait_metrics_ports() {
    for (const auto& [name, file] : metrics_ranks_) {
      uint16_t port = 0;
      if (int rc = wait_port_file(file, metrics_port_file(file), port); rc != 0) return rc;
    }
    if (Status st = write_metrics_json(); !st.ok()) return early_error(st.message(), true);
    return 0;
  }

  int spawn(const std::string& file, const std::string& display, std::vector<std::string> args) {
    kids_.push_back({file, display});
    auto pid = group_.spawn(file, c_.exe, args, logs_dir(c_) + "/" + file + ".stderr");
    if (!pid.ok()) return early_error("cannot start " + display + ": " + pid.status().str(), true);
    args_[file] = std::move(args);
    return 0;
  }

  // --- planned peer deaths (orchestrator.h) --------------------------------------------------

  // Whether the other engine has a data path to `rank` (report.h PeerDeathRecord).
  bool has_other_engine_peers(const std::string& rank) {
    auto r = RankId::parse(rank);
    bool ok = false;
    auto models = parse_models_json(read_file(c_.models_file, ok));
    if (!r || !ok || !models.ok()) return true;
    auto model = find_model(*models, c_.model);
    if (!model.ok()) return true;
    auto plan = plan_transfers(*model, c_.prefill_tp, c_.decode_tp);
    if (!plan.ok()) return true;
    return !(r->role == Role::kPrefill ? dests_of(*plan, r->tp_rank) : sources_of(*plan, r->tp_rank)).empty();
  }

  void tell_router(const std::string& type, const std::string& rank, int64_t time_ns,
                   const std::string& reason) {
    Status st = control_->send(router_endpoint_, encode_peer_death(type, rank, time_ns, reason));
    if (!st.ok()) err_ << "kvferry replay: cannot tell the router '" << type << "': " << st.str() << "\n";
  }

  // The router asked for the planned kill of `rank`.
  void kill_rank(const std::string& rank) {
    std::string file = rank;
    std::replace(file.begin(), file.end(), '/', '-');
    const auto pid = group_.pid_of(file);
    if (!pid || !group_.running(file) || !args_.count(file)) {
      tell_router("kill_failed", rank, 0, rank + " is not a running rank of this replay");
      return;
    }
    PeerDeathRecord d;
    d.rank = rank;
    d.other_engine_peers = has_other_engine_peers(rank);
    d.killed_ns = monotonic_ns();
    d.killed_at_s = elapsed_s();
    ::kill(*pid, SIGKILL);
    planned_exits_.insert(*pid);
    pending_restarts_.push_back({file, deaths_.size(), Clock::now() + std::chrono::milliseconds(c_.restart_delay_ms)});
    deaths_.push_back(d);
    out_ << fmt::format("replay: peer death: killed {} (pid {}) at {:.3f} s\n", rank, *pid, d.killed_at_s)
         << std::flush;
    tell_router("killed", rank, d.killed_ns, "");
  }

  // An exit the orchestrator caused (a planned kill): noted, not a failure.
  bool planned_exit(const ChildExit& e) {
    if (!planned_exits_.erase(e.pid)) return false;
    if (uint64_t n = set_aside_partial_line(logs_dir(c_) + "/" + e.name + ".jsonl")) {
      out_ << fmt::format("replay: peer death: the last {} bytes of {}.jsonl were an incomplete "
                          "line (killed mid-write); moved to {}.jsonl.killed-tail\n",
                          n, e.name, e.name);
    }
    process_exits_.push_back(fmt::format("{} (pid {}) {} (planned peer death)",
                                         display_name(kids_, e.name), e.pid, e.describe()));
    return true;
  }

  // Restarts killed ranks whose delay passed (once reaped); returns non-zero if one cannot start.
  int restart_due() {
    for (auto it = pending_restarts_.begin(); it != pending_restarts_.end();) {
      if (Clock::now() < it->due || group_.running(it->file)) {
        ++it;
        continue;
      }
      const std::string display = display_name(kids_, it->file);
      if (c_.metrics) {
        // The new process binds a new metrics port: metrics.json says "none yet" until it reports it.
        std::error_code ec;
        fs::remove(metrics_port_file(it->file), ec);
        (void)write_metrics_json();
      }
      auto pid = group_.spawn(it->file, c_.exe, args_[it->file],
                              logs_dir(c_) + "/" + it->file + ".stderr", /*append=*/true);
      if (!pid.ok()) {
        tell_router("kill_failed", display, 0, "restart failed: " + pid.status().str());
        return early_error("cannot restart " + display + ": " + pid.status().str(), true);
      }
      PeerDeathRecord& d = deaths_[it->death];
      d.restarted = true;
      d.restarted_ns = monotonic_ns();
      out_ << fmt::format("replay: peer death: restarted {} (pid {}) at {:.3f} s\n", display, *pid,
                          elapsed_s())
           << std::flush;
      tell_router("restarted", display, d.restarted_ns, "");
      it = pending_restarts_.erase(it);
    }
    return 0;
  }

  // Frames from the router (kill requests); waits up to `wait` for one. Sleeps without a socket.
  void serve_router(std::chrono::milliseconds wait) {
    if (!control_) {
      std::this_thread::sleep_for(wait);
      return;
    }
    for (auto text = control_->recv(wait); text; text = control_->recv(std::chrono::milliseconds(0))) {
      auto f = decode_peer_death_frame(*text);
      if (f.ok() && f->has_value() && (*f)->type == "kill") {
        kill_rank((*f)->rank);
      } else {
        err_ << "kvferry replay: unexpected frame from the router: "
             << (!f.ok() ? f.status().str() : f->has_value() ? (*f)->type : *text) << "\n";
      }
    }
  }

  // Stops everything, writes the partial report, prints `msg`; returns 1.
  int early_error(const std::string& msg, bool have_children) {
    end_progress();
    if (have_children) group_.stop_all(std::chrono::milliseconds(2000));
    err_ << "kvferry replay: " << msg << "\n";
    const std::string path = c_.out + "/report.json";
    if (write_file(path, partial_report_json(c_.to_json(), elapsed_s(), msg)).ok()) {
      err_ << "kvferry replay: partial report: " << path << "\n";
    }
    return 1;
  }

  // A child exited or failed: name it, show its stderr tail, stop everything.
  int child_failed(const ChildExit& e, const std::string& when) {
    const std::string display = display_name(kids_, e.name);
    const std::string log = logs_dir(c_) + "/" + e.name + ".stderr";
    std::string msg = fmt::format("{} (pid {}) {} {}", display, e.pid, e.describe(), when);
    const std::string tail = tail_file(log, 15);
    msg += tail.empty() ? fmt::format("; {} is empty", log)
                        : fmt::format("; last lines of {}:\n{}", log, tail);
    return early_error(msg, true);
  }

  // Waits for the port file of child `file` (Ports, orchestrator.h) and stores the port.
  int wait_port(const std::string& file, uint16_t& port) {
    return wait_port_file(file, logs_dir(c_) + "/" + file + ".port", port);
  }
  int wait_port_file(const std::string& file, const std::string& path, uint16_t& port) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(c_.ready_timeout_s);
    while (true) {
      if (auto got = read_port_file(path)) {
        port = *got;
        return 0;
      }
      for (const auto& e : group_.reap()) return child_failed(e, "before it was listening");
      if (g_signal != 0) return stopped_by_signal();
      if (Clock::now() > deadline) {
        return early_error(fmt::format("{} did not report a listening port within {} s ({})",
                                       display_name(kids_, file), c_.ready_timeout_s, path),
                           true);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // --- progress (progress.h) -------------------------------------------------------------------

  // The router's latest snapshot (results.json.progress); nullopt before the first.
  std::optional<ReplayResults> read_progress() const {
    bool ok = false;
    const std::string text = read_file(c_.out + "/results.json.progress", ok);
    if (!ok) return std::nullopt;
    auto r = decode_results(text);
    if (!r.ok()) return std::nullopt;
    return std::move(*r);
  }

  void show_progress() {
    if (c_.progress != "bar" && c_.progress != "lines") return;
    const bool bar = c_.progress == "bar";
    const auto period = bar ? std::chrono::duration<double>(0.25)
                            : std::chrono::duration<double>(c_.progress_interval_s);
    if (Clock::now() - last_progress_ < period) return;
    last_progress_ = Clock::now();
    auto r = read_progress();
    if (!r) return;
    const Progress p = progress_of(*r, monotonic_ns());
    if (bar) {
      err_ << "\r\033[K" << progress_bar(p, 100) << std::flush;
      bar_shown_ = true;
    } else {
      err_ << progress_line(p) << "\n" << std::flush;
    }
  }

  void end_progress() {
    if (bar_shown_) err_ << "\n" << std::flush;
    bar_shown_ = false;
  }

  // SIGINT/SIGTERM: the router first (it writes the results so far and exits), then every rank
  // (each finishes its step, flushes its log and metrics and exits), then a partial report of the
  // requests that finished.
  int stopped_by_signal() {
    const int sig = g_signal;
    end_progress();
    const std::string msg = fmt::format("stopped by signal {} ({}); every child process was stopped", sig,
                                        strsignal(sig));
    if (group_.running("router")) {
      group_.signal("router", SIGTERM);
      group_.wait_for("router", std::chrono::milliseconds(3000));
    }
    group_.stop_all(std::chrono::milliseconds(3000));
    err_ << "kvferry replay: " << msg << "\n";
    bool ok = false;
    std::optional<ReplayResults> results;
    if (std::string text = read_file(c_.out + "/results.json", ok); ok) {
      if (auto r = decode_results(text); r.ok()) results = std::move(*r);
    }
    if (!results) results = read_progress();
    const std::string path = c_.out + "/report.json";
    std::string report_text = partial_report_json(c_.to_json(), elapsed_s(), msg);
    if (results) {
      const ReplayResults done = finished_only(*results);
      Report rep = build_report(done, scan_log_files(logs_dir(c_)), deaths_, c_.prefill_tp, c_.decode_tp);
      rep.process_exits = process_exits_;
      auto j = nlohmann::ordered_json::parse(report_json(rep, done, c_.to_json(), elapsed_s(), msg));
      j["status"] = "partial";
      j["partial"] = true;
      j["requests"]["planned"] = results->requests.size();
      j["requests"]["unfinished"] = results->requests.size() - done.requests.size();
      report_text = j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
      out_ << summary_text(rep, elapsed_s());
    }
    if (write_file(path, report_text).ok()) err_ << "kvferry replay: partial report: " << path << "\n";
    return 128 + sig;
  }

  // Until the router exits 0. Any other exit first is fatal, except a rank exiting 0 (it got the
  // shutdown) and a planned peer death.
  int supervise() {
    const auto deadline = t0_ + std::chrono::duration<double>(c_.timeout_s);
    auto next_note = Clock::now() + std::chrono::seconds(30);
    while (true) {
      for (const auto& e : group_.reap()) {
        if (e.name == "router") {
          if (e.ok()) {
            process_exits_.push_back(fmt::format("router (pid {}) {}", e.pid, e.describe()));
            pending_restarts_.clear();  // the replay is over: a rank still down stays down
            end_progress();
            return 0;
          }
          return child_failed(e, "(the router failed)");
        }
        if (planned_exit(e)) continue;
        if (e.ok() && e.name != "bootstrap") {
          // Ranks exit 0 only on the router's shutdown, which can beat the router's own exit.
          process_exits_.push_back(
              fmt::format("{} (pid {}) {}", display_name(kids_, e.name), e.pid, e.describe()));
          continue;
        }
        return child_failed(e, "before the replay finished");
      }
      if (int rc = restart_due(); rc != 0) return rc;
      if (c_.metrics && !all_ports_) (void)write_metrics_json();  // a restarted rank's new port
      if (g_signal != 0) return stopped_by_signal();
      if (Clock::now() > deadline) {
        return early_error(fmt::format("the replay did not finish within --timeout-s {}",
                                       c_.timeout_s),
                           true);
      }
      if (c_.progress == "off" && Clock::now() > next_note) {
        out_ << fmt::format("replay: running for {:.0f} s\n", elapsed_s()) << std::flush;
        next_note += std::chrono::seconds(30);
      }
      show_progress();
      serve_router(std::chrono::milliseconds(control_ ? 5 : 50));
    }
  }

  // Ranks exit on the router's shutdown; give them 30 s, then stop the bootstrap service.
  void finish_processes() {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    auto note = [&](const ChildExit& e) {
      if (planned_exit(e)) return;
      process_exits_.push_back(
          fmt::format("{} (pid {}) {}", display_name(kids_, e.name), e.pid, e.describe()));
      // The bootstrap service is stopped with SIGTERM below (a kill after the grace is not its
      // fault), but it must still exit 0: a sanitizer report at exit is a non-zero code.
      if (!e.ok() && (e.name != "bootstrap" || e.signal == 0)) {
        process_problems_.push_back(fmt::format("{} {} after the shutdown",
                                                display_name(kids_, e.name), e.describe()));
      }
    };
    while (group_.running_count() > (group_.running("bootstrap") ? 1u : 0u) &&
           Clock::now() < deadline && g_signal == 0) {
      for (const auto& e : group_.reap()) note(e);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (const auto& k : kids_) {
      if (k.file != "bootstrap" && group_.running(k.file)) {
        process_problems_.push_back(k.display + " did not exit within 30 s of the shutdown");
      }
    }
    for (const auto& e : group_.stop_all(std::chrono::milliseconds(5000))) note(e);
  }

  int report() {
    const std::string results_path = c_.out + "/results.json";
    bool ok = false;
    const std::string text = read_file(results_path, ok);
    if (!ok) return early_error("the router exited 0 but wrote no " + results_path, false);
    auto results = decode_results(text);
    if (!results.ok()) return early_error(results.status().str(), false);
    Report rep = build_report(*results, scan_log_files(logs_dir(c_)), deaths_, c_.prefill_tp,
                              c_.decode_tp);
    rep.process_problems = process_problems_;
    rep.process_exits = process_exits_;
    const double wall = elapsed_s();
    const std::string path = c_.out + "/report.json";
    Status st = write_file(path, report_json(rep, *results, c_.to_json(), wall, ""));
    if (!st.ok()) {
      err_ << "kvferry replay: " << st.message() << "\n";
      return 1;
    }
    out_ << summary_text(rep, wall);
    out_ << "report: " << path << "\n";
    const auto problems = rep.problems();
    if (problems.empty()) return 0;
    err_ << "kvferry replay: the replay ran but is not clean:\n";
    for (const auto& p : problems) err_ << "  - " << p << "\n";
    return 1;
  }

  const ReplayConfig& c_;
  std::ostream& out_;
  std::ostream& err_;
  Clock::time_point t0_;
  ProcessGroup group_;
  std::vector<ChildInfo> kids_;
  std::vector<std::string> process_problems_;
  std::vector<std::string> process_exits_;
  std::map<std::string, std::vector<std::string>> args_;  // file name -> command line
  // Planned peer deaths.
  struct PendingRestart {
    std::string file;
    size_t death = 0;  // index in deaths_
    Clock::time_point due;
  };
  std::unique_ptr<ControlSocket> control_;  // null: no peer deaths planned
  std::string router_endpoint_;
  std::vector<PeerDeathRecord> deaths_;
  std::set<pid_t> planned_exits_;
  std::vector<PendingRestart> pending_restarts_;
  Clock::time_point last_progress_{};
  bool bar_shown_ = false;
  std::vector<std::pair<std::string, std::string>> metrics_ranks_;  // --metrics: (name, file) per rank
  bool all_ports_ = false;  // metrics.json names every rank's metrics port
};

}  // namespace

int run_replay(ReplayConfig config, std::ostream& out, std::ostream& err) {
  Status st = validate(config);
  if (!st.ok()) {
    err << "kvferry replay: " << st.message() << "\n";
    return 2;
  }
  Run run(config, out, err);
  return run.go();
}

}  // namespace kvferry::replay
