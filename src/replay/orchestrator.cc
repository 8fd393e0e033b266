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
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvferry/net.h"
#include "kvferry/port_file.h"
#include "kvferry/trace.h"
#include "process/process.h"
#include "replay/net_fault_executor.h"
#include "replay/out_files.h"
#include "replay/peer_death_executor.h"
#include "replay/progress.h"
#include "replay/report.h"
#include "replay/results.h"

namespace kvferry::replay {
using process::ChildExit;
using process::ProcessGroup;
using process::tail_file;
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// How long a rank may take to stop on its own after a Ctrl-C of the replay (stopped_by_signal).
constexpr std::chrono::milliseconds kSignalStopGrace{10000};

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

std::string read_file(const std::string& path, bool& ok) { return read_text_file(path, ok); }
Status write_file(const std::string& path, const std::string& text) { return write_file_atomic(path, text); }

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

// The bootstrap services ("bootstrap", "bootstrap1", ...: one per prefill instance).
bool is_bootstrap(const std::string& file) { return file.rfind("bootstrap", 0) == 0; }

// One replay run after validation; owns the children.
class Run {
 public:
  Run(const ReplayConfig& c, std::ostream& out, std::ostream& err)
      : c_(c), out_(out), err_(err), t0_(Clock::now()), deaths_(c, group_, out, err, t0_) {}

  int go() {
    std::error_code ec;
    fs::create_directories(logs_dir(c_), ec);
    if (ec) return early_error("cannot create " + logs_dir(c_) + ": " + ec.message(), false);
    clean_previous(c_);
    SignalGuard signals;
    Ports p;
    if (Status st = deaths_.bind(); !st.ok()) return early_error(st.message(), false);
    p.orchestrator = deaths_.port();
    if (c_.metrics) {
      if (int rc = setup_metrics(); rc != 0) return rc;
    }

    const std::string instances =
        c_.prefill_instances == 1 && c_.decode_instances == 1
            ? std::string()
            : fmt::format(" ({} prefill x {} decode instances)", c_.prefill_instances, c_.decode_instances);
    out_ << fmt::format("replay: {} requests of {} at prefill TP {} x DP {} / decode TP {} x DP {}{}{}, "
                        "{} transport, decode pool {} MiB/rank{}\n",
                        c_.max_requests == 0 ? std::string("all") : std::to_string(c_.max_requests),
                        c_.model, c_.prefill_tp, c_.prefill_dp, c_.decode_tp, c_.decode_dp, instances,
                        c_.scale.empty() ? std::string() : ", scaling " + c_.scale,
                        c_.transport, c_.pool_mib, c_.pool_mib_auto ? " (automatic)" : "");
    if (c_.hosts) out_ << placement_text(c_);
    out_ << "replay: logs in " << logs_dir(c_) << "\n" << std::flush;

    // Every listening child binds port 0 and reports its port (Ports, child_args.h). The
    // bootstrap service and the router listen before any rank starts, so the ranks' first
    // registration and "ready" frame find them; each DP group's leader before its followers.
    // xPyD: one bootstrap service per prefill instance; decode ranks default to instance 0's.
    // --scale: a joining prefill instance's too (the router names it to decode from the start).
    for (uint32_t i = 0; i < all_prefill_; ++i) {
      if (int rc = spawn(bootstrap_file(i), bootstrap_file(i), bootstrap_args(c_, p, i)); rc != 0) return rc;
    }
    p.prefill_bootstraps.assign(all_prefill_, 0);
    for (uint32_t i = 0; i < all_prefill_; ++i) {
      if (int rc = wait_port(bootstrap_file(i), p.prefill_bootstraps[i]); rc != 0) return rc;
    }
    p.bootstrap = p.prefill_bootstraps[0];
    if (int rc = spawn("router", "router", router_args(c_, p)); rc != 0) return rc;
    if (int rc = wait_port("router", p.router); rc != 0) return rc;
    if (deaths_.active()) deaths_.set_router_endpoint(zmq_endpoint(router_address(c_), p.router));
    ports_ = p;
    for (bool prefill : {true, false}) {
      for (uint32_t i = 0; i < (prefill ? c_.prefill_instances : c_.decode_instances); ++i) {
        Ports pi = p;
        if (prefill) pi.bootstrap = p.prefill_bootstraps[i];
        if (int rc = spawn_engine(pi, prefill, i); rc != 0) return rc;
      }
    }
    if (c_.metrics) {
      if (int rc = wait_metrics_ports(); rc != 0) return rc;
    }
    if ((c_.fault_plan.has_net_faults() && c_.hosts) || c_.fault_plan.has_pauses()) {
      // link_down / partition / pause (net_fault_executor.h): planned against the trace's requests.
      auto trace = load_trace(c_.trace, c_.max_requests);
      if (!trace.ok()) return early_error("trace: " + trace.status().message(), true);
      auto pid_of = [this](const std::string& rank) -> std::optional<int> {
        auto r = RankId::parse(rank);
        if (!r) return std::nullopt;
        auto pid = group_.pid_of(rank_file(r->role == Role::kPrefill, r->tp_rank, r->dp_rank));
        return pid ? std::optional<int>(*pid) : std::nullopt;
      };
      net_ = std::make_unique<NetFaultExecutor>(plan_net_faults(c_.fault_plan, trace->size(), c_.seed),
                                                c_.hosts ? c_.hosts->hosts : std::map<std::string, NetHost>{},
                                                logs_dir(c_), out_, pid_of);
    }
    if (int rc = supervise(); rc != 0) return rc;
    if (net_) net_->heal_all();  // the router is done: nothing may stay cut off
    finish_processes();
    return report();
  }

 private:
  double elapsed_s() const {
    return std::chrono::duration<double>(Clock::now() - t0_).count();
  }

  // One engine instance: every DP group's leader, then (once each reported its port) their
  // followers with it. `p`: the instance's own ports (bootstrap: a prefill instance's own).
  int spawn_engine(Ports& p, bool prefill, uint32_t in) {
    const uint32_t tp = prefill ? c_.prefill_tp : c_.decode_tp;
    const uint32_t dp = prefill ? c_.prefill_dp : c_.decode_dp;
    auto& engines = prefill ? p.prefill_engines : p.decode_engines;
    engines.clear();
    for (uint32_t g = 0; g < dp; ++g) {
      if (int rc = spawn(rank_file(prefill, 0, g, in), rank_name(prefill, 0, g, in), rank_args(c_, p, prefill, 0, g, in));
          rc != 0) {
        return rc;
      }
    }
    engines.assign(dp, 0);
    for (uint32_t g = 0; g < dp; ++g) {
      const std::string leader = rank_file(prefill, 0, g, in);
      if (int rc = wait_port(leader, engines[g]); rc != 0) return rc;
      // A restarted leader (peer death) binds the same port: its followers know only that one.
      deaths_.set_command(leader, rank_name(prefill, 0, g, in), rank_args(c_, p, prefill, 0, g, in));
    }
    for (uint32_t g = 0; g < dp; ++g) {
      for (uint32_t r = 1; r < tp; ++r) {
        if (int rc = spawn(rank_file(prefill, r, g, in), rank_name(prefill, r, g, in),
                           rank_args(c_, p, prefill, r, g, in));
            rc != 0) {
          return rc;
        }
      }
    }
    return 0;
  }

  // --scale: starts each joining instance at its event's time, which counts from the router's
  // first dispatch (the progress file's dispatch_start_ns, same clock: one host).
  int joins_due() {
    if (c_.scale_events.size() == started_ns_.size() + leaves_) return 0;
    if (dispatch_start_ns_ == 0) {
      if (Clock::now() - last_start_poll_ < std::chrono::milliseconds(20)) return 0;
      last_start_poll_ = Clock::now();
      auto r = read_progress();
      if (!r || r->dispatch_start_ns == 0) return 0;
      dispatch_start_ns_ = r->dispatch_start_ns;
    }
    for (const ScaleEvent& e : c_.scale_events) {
      if (!e.join || started_ns_.count({e.role, e.instance}) ||
          monotonic_ns() < dispatch_start_ns_ + static_cast<int64_t>(e.t_s * 1e9)) {
        continue;
      }
      out_ << fmt::format("replay: {}: starting {} instance {}\n", e.str(), role_name(e.role), e.instance) << std::flush;
      started_ns_[{e.role, e.instance}] = monotonic_ns();
      Ports pi = ports_;
      if (e.role == Role::kPrefill) pi.bootstrap = ports_.prefill_bootstraps[e.instance];
      if (int rc = spawn_engine(pi, e.role == Role::kPrefill, e.instance); rc != 0) return rc;
    }
    return 0;
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
      for (uint32_t in = 0; in < (prefill ? c_.prefill_instances : c_.decode_instances); ++in) {
        for (uint32_t g = 0; g < (prefill ? c_.prefill_dp : c_.decode_dp); ++g) {
          for (uint32_t r = 0; r < (prefill ? c_.prefill_tp : c_.decode_tp); ++r) {
            metrics_ranks_.emplace_back(rank_name(prefill, r, g, in), rank_file(prefill, r, g, in));
          }
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
      j[name] = {{"url", port ? nlohmann::ordered_json("http://" + host_port(child_address(c_, file), *port) + "/metrics")
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
    auto pid = group_.spawn(file, c_.exe, args, logs_dir(c_) + "/" + file + ".stderr", false,
                            child_exec(c_, file));
    if (!pid.ok()) return early_error("cannot start " + display + ": " + pid.status().str(), true);
    deaths_.set_command(file, display, std::move(args));
    return 0;
  }

  // --- planned peer deaths (peer_death_executor.h) ------------------------------------------

  // An exit the orchestrator caused (a planned kill): noted, not a failure.
  bool planned_exit(const ChildExit& e) {
    auto note = deaths_.planned_exit(e);
    if (!note) return false;
    process_exits_.push_back(std::move(*note));
    return true;
  }

  // Restarts killed ranks whose delay passed (once reaped); returns non-zero if one cannot start.
  int restart_due() {
    Status st = deaths_.restart_due([this](const std::string& file) {
      if (c_.metrics) {
        // The new process binds a new metrics port: metrics.json says "none yet" until it reports it.
        std::error_code ec;
        fs::remove(metrics_port_file(file), ec);
        (void)write_metrics_json();
      }
    });
    return st.ok() ? 0 : early_error(st.message(), true);
  }

  // Network faults due (injected at their dispatch count, healed after their length); the
  // router's progress file is read at most every 20 ms.
  int net_faults_due() {
    if (!net_) return 0;
    const auto now = Clock::now();
    if (now - last_net_poll_ < std::chrono::milliseconds(20)) return 0;
    last_net_poll_ = now;
    Status st = net_->poll(dispatched_so_far(c_.out), monotonic_ns());
    return st.ok() ? 0 : early_error("network fault: " + st.message(), true);
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

  // Waits for the port file of child `file` (Ports, child_args.h) and stores the port.
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
      for (const auto& e : group_.reap()) {
        // --scale: a leaving instance's rank exits 0 while a joining one starts.
        if (!c_.scale_events.empty() && e.ok() && e.name != file && !is_bootstrap(e.name) && e.name != "router") {
          process_exits_.push_back(fmt::format("{} (pid {}) {}", display_name(kids_, e.name), e.pid, e.describe()));
          continue;
        }
        return child_failed(e, "before it was listening");
      }
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
  // requests that finished. A rank gets kSignalStopGrace before it is killed: one in the middle of
  // a transfer on a loaded host needed more than 3 s to agree the stop with its engine and write
  // its metrics (seen on a 2-core VM whose page faults are slow); a kill loses its final metrics.
  int stopped_by_signal() {
    const int sig = g_signal;
    end_progress();
    const std::string msg = fmt::format("stopped by signal {} ({}); every child process was stopped", sig,
                                        strsignal(sig));
    if (group_.running("router")) {
      group_.signal("router", SIGTERM);
      group_.wait_for("router", std::chrono::milliseconds(3000));
    }
    group_.stop_all(kSignalStopGrace);
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
      Report rep = build_report(done, scan_log_files(logs_dir(c_)), deaths_.records(), c_.prefill_tp, c_.decode_tp);
      add_instance_figures(rep, done, all_prefill_, instances_in_all(c_, Role::kDecode));
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
            deaths_.cancel_restarts();  // the replay is over: a rank still down stays down
            end_progress();
            return 0;
          }
          return child_failed(e, "(the router failed)");
        }
        if (planned_exit(e)) continue;
        if (e.ok() && !is_bootstrap(e.name)) {
          // Ranks exit 0 only on the router's shutdown, which can beat the router's own exit.
          process_exits_.push_back(
              fmt::format("{} (pid {}) {}", display_name(kids_, e.name), e.pid, e.describe()));
          continue;  // --scale: also a leaving instance's rank (the router's "leave")
        }
        return child_failed(e, "before the replay finished");
      }
      if (int rc = restart_due(); rc != 0) return rc;
      if (int rc = net_faults_due(); rc != 0) return rc;
      if (int rc = joins_due(); rc != 0) return rc;
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
      deaths_.serve(std::chrono::milliseconds(deaths_.active() ? 5 : 50));
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
      if (!e.ok() && (!is_bootstrap(e.name) || e.signal == 0)) {
        process_problems_.push_back(fmt::format("{} {} after the shutdown",
                                                display_name(kids_, e.name), e.describe()));
      }
    };
    auto bootstraps_running = [this] {
      size_t n = 0;
      for (uint32_t i = 0; i < all_prefill_; ++i) n += group_.running(bootstrap_file(i)) ? 1 : 0;
      return n;
    };
    while (group_.running_count() > bootstraps_running() &&
           Clock::now() < deadline && g_signal == 0) {
      for (const auto& e : group_.reap()) note(e);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (const auto& k : kids_) {
      if (!is_bootstrap(k.file) && group_.running(k.file)) {
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
    Report rep = build_report(*results, scan_log_files(logs_dir(c_)), deaths_.records(), c_.prefill_tp,
                              c_.decode_tp);
    add_instance_figures(rep, *results, all_prefill_, instances_in_all(c_, Role::kDecode));
    add_scale_events(rep, *results, started_ns_);
    if (net_) {
      add_net_fault_checks(rep, *results, net_->records(),
                           c_.hosts ? rank_hosts(*c_.hosts, c_.prefill_dp, c_.decode_dp)
                                    : std::map<std::string, std::string>{},
                           c_.deadlines.heartbeat_timeout_ms);
    }
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
  PeerDeathExecutor deaths_;  // after group_ and t0_: it uses both
  std::unique_ptr<NetFaultExecutor> net_;  // link_down / partition (heals what it cut on destruction)
  Clock::time_point last_net_poll_{};
  Clock::time_point last_progress_{};
  bool bar_shown_ = false;
  std::vector<std::pair<std::string, std::string>> metrics_ranks_;  // --metrics: (name, file) per rank
  bool all_ports_ = false;  // metrics.json names every rank's metrics port
  // --scale: every prefill instance (joining ones too), the first start's ports, each join's start.
  const uint32_t all_prefill_ = instances_in_all(c_, Role::kPrefill);
  Ports ports_;
  std::map<std::pair<Role, uint32_t>, int64_t> started_ns_;
  const size_t leaves_ = size_t(std::count_if(c_.scale_events.begin(), c_.scale_events.end(),
                                              [](const ScaleEvent& e) { return !e.join; }));
  int64_t dispatch_start_ns_ = 0;
  Clock::time_point last_start_poll_{};
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
