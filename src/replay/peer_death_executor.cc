// Planned peer deaths as the orchestrator carries them out (peer_death_executor.h).
#include "replay/peer_death_executor.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "endpoint/topology.h"
#include "kvferry/geometry.h"
#include "kvferry/net.h"
#include "kvferry/port_file.h"
#include "replay/child_args.h"
#include "replay/peer_death_frames.h"

namespace kvferry::replay {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path, bool& ok) {
  std::ifstream in(path, std::ios::binary);
  ok = static_cast<bool>(in);
  std::stringstream ss;
  if (ok) ss << in.rdbuf();
  return ss.str();
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

PeerDeathExecutor::PeerDeathExecutor(const ReplayConfig& c, process::ProcessGroup& group,
                                     std::ostream& out, std::ostream& err, Clock::time_point t0)
    : c_(c), group_(group), out_(out), err_(err), t0_(t0) {}

Status PeerDeathExecutor::bind() {
  if (!c_.fault_plan.has_peer_death()) return Status::Ok();
  const std::string host = replay_address(c_);
  auto sock = ControlSocket::bind(make_listen_address(host, ""));
  if (!sock.ok()) {
    std::string msg = "cannot bind the orchestrator's socket on " + host + ": " + sock.status().str();
    if (c_.hosts) {
      // The router sends kill requests to the replay's host: the replay must run there.
      const HostEntry& h = c_.hosts->replay();
      std::string exec;
      for (const auto& a : h.exec) exec += a + " ";
      msg += fmt::format("; peer_death needs the replay on host {} ({}, --hosts place.replay, default the "
                         "router's host): run it there, e.g. `{}kvferry replay ...`",
                         h.name, h.address, exec);
    }
    return {sock.status().code(), msg};
  }
  control_ = std::move(*sock);
  return Status::Ok();
}

uint16_t PeerDeathExecutor::port() const {
  return control_ ? endpoint_port(control_->endpoint()).value_or(0) : 0;
}

void PeerDeathExecutor::set_command(const std::string& file, std::string display,
                                    std::vector<std::string> args) {
  commands_[file] = Command{std::move(display), std::move(args)};
}

double PeerDeathExecutor::elapsed_s() const {
  return std::chrono::duration<double>(Clock::now() - t0_).count();
}

// Whether the other engine has a data path to `rank` (report.h PeerDeathRecord).
bool PeerDeathExecutor::has_other_engine_peers(const std::string& rank) {
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

void PeerDeathExecutor::tell_router(const std::string& type, const std::string& rank,
                                    int64_t time_ns, const std::string& reason) {
  Status st = control_->send(router_endpoint_, encode_peer_death(type, rank, time_ns, reason));
  if (!st.ok()) err_ << "kvferry replay: cannot tell the router '" << type << "': " << st.str() << "\n";
}

// The router asked for the planned kill of `rank`.
void PeerDeathExecutor::kill_rank(const std::string& rank) {
  std::string file = rank;
  std::replace(file.begin(), file.end(), '/', '-');
  const auto pid = group_.pid_of(file);
  if (!pid || !group_.running(file) || !commands_.count(file)) {
    tell_router("kill_failed", rank, 0, rank + " is not a running rank of this replay");
    return;
  }
  PeerDeathRecord d;
  d.rank = rank;
  d.other_engine_peers = has_other_engine_peers(rank);
  const auto pinned_ranks = same_port_restarts(c_.fault_plan);
  std::vector<std::string> pinned;
  if (std::find(pinned_ranks.begin(), pinned_ranks.end(), rank) != pinned_ranks.end()) {
    auto ports = restart_ports(c_, file);
    if (!ports.ok()) {
      tell_router("kill_failed", rank, 0, "restart@: " + ports.status().message());
      return;
    }
    pinned = std::move(*ports);
    d.same_ports = true;
  }
  d.killed_ns = monotonic_ns();
  d.killed_at_s = elapsed_s();
  ::kill(*pid, SIGKILL);
  planned_exits_.insert(*pid);
  pending_restarts_.push_back(
      {file, deaths_.size(), Clock::now() + std::chrono::milliseconds(c_.restart_delay_ms), std::move(pinned)});
  deaths_.push_back(d);
  out_ << fmt::format("replay: peer death: killed {} (pid {}) at {:.3f} s\n", rank, *pid, d.killed_at_s)
       << std::flush;
  tell_router("killed", rank, d.killed_ns, "");
}

std::optional<std::string> PeerDeathExecutor::planned_exit(const process::ChildExit& e) {
  if (!planned_exits_.erase(e.pid)) return std::nullopt;
  if (uint64_t n = set_aside_partial_line(logs_dir(c_) + "/" + e.name + ".jsonl")) {
    out_ << fmt::format("replay: peer death: the last {} bytes of {}.jsonl were an incomplete "
                        "line (killed mid-write); moved to {}.jsonl.killed-tail\n",
                        n, e.name, e.name);
  }
  auto it = commands_.find(e.name);
  const std::string& display = it == commands_.end() ? e.name : it->second.display;
  return fmt::format("{} (pid {}) {} (planned peer death)", display, e.pid, e.describe());
}

Status PeerDeathExecutor::restart_due(const std::function<void(const std::string& file)>& before_spawn) {
  for (auto it = pending_restarts_.begin(); it != pending_restarts_.end();) {
    if (Clock::now() < it->due || group_.running(it->file)) {
      ++it;
      continue;
    }
    const Command& cmd = commands_[it->file];
    before_spawn(it->file);
    std::vector<std::string> args = cmd.args;
    args.insert(args.end(), it->pinned.begin(), it->pinned.end());
    auto pid = group_.spawn(it->file, c_.exe, args, logs_dir(c_) + "/" + it->file + ".stderr",
                            /*append=*/true, child_exec(c_, it->file));
    if (!pid.ok()) {
      tell_router("kill_failed", cmd.display, 0, "restart failed: " + pid.status().str());
      return {ErrorCode::kInternal, "cannot restart " + cmd.display + ": " + pid.status().str()};
    }
    PeerDeathRecord& d = deaths_[it->death];
    d.restarted = true;
    d.restarted_ns = monotonic_ns();
    out_ << fmt::format("replay: peer death: restarted {} (pid {}) at {:.3f} s{}\n", cmd.display, *pid,
                        elapsed_s(), it->pinned.empty() ? "" : " on the same ports")
         << std::flush;
    tell_router("restarted", cmd.display, d.restarted_ns, "");
    it = pending_restarts_.erase(it);
  }
  return Status::Ok();
}

void PeerDeathExecutor::serve(std::chrono::milliseconds wait) {
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

}  // namespace kvferry::replay
