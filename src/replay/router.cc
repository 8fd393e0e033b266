// The replay router (router.h): plan, dispatch with back-pressure, aborts and peer deaths,
// collect, shut down, write.
#include "replay/router.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <set>
#include <tuple>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/stop_request.h"
#include "kvferry/control.h"
#include "kvferry/log.h"
#include "kvferry/port_file.h"
#include "kvferry/routing.h"
#include "replay/out_files.h"
#include "replay/peer_death_frames.h"
#include "replay/peer_death_schedule.h"
#include "replay/results.h"
#include "replay/router_instances.h"
#include "replay/router_scale.h"

namespace kvferry::replay {
namespace {

constexpr std::string_view kComponent = "router";

int fail(const std::string& msg) {
  log_event(LogLevel::kError, kComponent, msg);
  flush_logging();
  std::cerr << "kvferry router: " << msg << "\n";
  return 1;
}

int64_t seconds_ns(double s) { return static_cast<int64_t>(s * 1e9); }

// Stopped by SIGTERM/SIGINT (core/stop_request.h).
Status stopped() { return {ErrorCode::kAborted, fmt::format("stopped by signal {}", stop_signal())}; }

// Sends `frame` to `dest`, retrying a full queue for up to `patience`.
Status send_patiently(ControlSocket& sock, const std::string& dest, const std::string& frame,
                      std::chrono::milliseconds patience) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (true) {
    Status st = sock.send(dest, frame);
    if (st.ok() || std::chrono::steady_clock::now() >= deadline) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

class Router {
 public:
  // `c`: every instance (--scale: the joining ones too); `initial`: the ones there from the start.
  Router(const RouterConfig& c, ControlSocket& sock, std::vector<RouterRequest> plan,
         std::vector<PlannedPeerDeath> deaths, std::vector<ScaleEvent> scale, std::pair<uint32_t, uint32_t> initial)
      : c_(c),
        inst_(c.prefill_instances, c.prefill_dp, c.decode_instances, c.decode_dp, c.prefill_leaders,
              c.decode_leaders),
        scale_(std::move(scale), inst_),
        initial_{initial.first, initial.second},
        sock_(sock),
        plan_(std::move(plan)),
        deaths_(std::move(deaths)) {
    res_.requests.resize(plan_.size());
    for (size_t i = 0; i < plan_.size(); ++i) {
      const RouterRequest& q = plan_[i];
      RequestOutcome& o = res_.requests[i];
      o.room = q.room;
      o.input_tokens = q.input_tokens;
      o.output_tokens = q.output_tokens;
      o.arrival_ms = q.arrival_ms;
      o.fault = q.fault;
      index_[q.room] = i;
    }
    done_.assign(plan_.size(), false);
  }

  Status wait_ready() {
    std::set<std::tuple<Role, uint32_t, uint32_t>> ready;  // (role, instance, DP rank)
    const size_t groups = size_t(initial_[0]) * inst_.dp(Role::kPrefill) + size_t(initial_[1]) * inst_.dp(Role::kDecode);
    const int64_t deadline = monotonic_ns() + seconds_ns(c_.ready_timeout_s);
    while (ready.size() < groups) {
      if (stop_requested()) return stopped();
      if (monotonic_ns() > deadline) {
        std::string missing;
        for (Role role : {Role::kPrefill, Role::kDecode}) {
          for (uint32_t in = 0; in < initial(role); ++in) {
            for (uint32_t dp = 0; dp < inst_.dp(role); ++dp) {
              if (ready.count({role, in, dp})) continue;
              missing += in == 0 ? fmt::format(" {} dp{}", role_name(role), dp)
                                 : fmt::format(" {} instance {} dp{}", role_name(role), in, dp);
            }
          }
        }
        return {ErrorCode::kWaitingTimeout,
                fmt::format("engines not ready within {} s (not ready:{})", c_.ready_timeout_s, missing)};
      }
      auto text = sock_.recv(std::chrono::milliseconds(100));
      if (!text) continue;
      auto f = decode_router_frame(*text);
      if (!f.ok()) {
        log_event(LogLevel::kWarning, kComponent, "dropped a malformed frame: " + f.status().str());
        continue;
      }
      if (f->type != "ready" || !f->ready_role) {
        log_event(LogLevel::kWarning, kComponent, "unexpected '" + f->type + "' frame before ready");
        continue;
      }
      const Role role = *f->ready_role;
      const uint32_t want = role == Role::kPrefill ? c_.prefill_tp : c_.decode_tp;
      if (f->ready_tp_size != want) {
        return {ErrorCode::kProtocolError,
                fmt::format("{} engine reports tp_size {}, expected {}",
                            role_name(role), f->ready_tp_size, want)};
      }
      if (f->dp_rank >= inst_.dp(role) || f->instance >= initial(role)) {
        return {ErrorCode::kProtocolError,
                fmt::format("{} engine reports instance {} dp_rank {}, expected {} instances of DP size {}",
                            role_name(role), f->instance, f->dp_rank, inst_.instances(role), inst_.dp(role))};
      }
      auto& group = inst_.leaders(role, f->instance);
      if (!f->ready_endpoint.empty()) group[f->dp_rank] = f->ready_endpoint;
      if (group[f->dp_rank].empty()) {
        return {ErrorCode::kProtocolError,
                fmt::format("{} engine dp{} is ready but no endpoint is known for it",
                            role_name(role), f->dp_rank)};
      }
      if (ready.insert({role, f->instance, f->dp_rank}).second) {
        log_event(LogLevel::kInfo, kComponent,
                  fmt::format("{} engine ready (instance {}, dp {}, tp {}) at {}", role_name(role), f->instance,
                              f->dp_rank, want, group[f->dp_rank]));
      }
    }
    // Every engine said it is ready. The router's first frames to a leader go out on a new
    // connection, and the control socket drops frames held past its first-contact window (1 s) if
    // the connection was not up by then: on a busy machine a loopback connect can take that long,
    // and the engine would never hear of its requests. So the connections come up first.
    for (Role role : {Role::kPrefill, Role::kDecode})
      for (uint32_t in = 0; in < initial(role); ++in)
        if (Status st = connect(role, in); !st.ok()) return st;
    return Status::Ok();
  }

  Status connect(Role role, uint32_t in) {
    for (const std::string& leader : inst_.leaders(role, in))
      if (Status st = sock_.wait_connected(leader, std::chrono::seconds(60)); !st.ok())
        return {st.code(), fmt::format("{} engine at {}: {}", role_name(role), leader, st.message())};
    return Status::Ok();
  }

  Status dispatch_all() {
    const int64_t start = monotonic_ns();
    res_.dispatch_start_ns = start;
    scale_.start(start);
    const size_t max_inflight = std::max<uint32_t>(1, c_.max_inflight);
    while (finished_ < plan_.size() || !deaths_.settled(finished_, plan_.size()) || !scale_.settled()) {
      int64_t now = monotonic_ns();
      int64_t next_due = -1;
      if (Status st = advance_deaths(now); !st.ok()) return st;
      if (Status st = advance_scale(now); !st.ok()) return st;
      while (!deaths_.paused() && next_ < plan_.size() && inflight_.size() < max_inflight &&
             !kill_due()) {
        const int64_t due = start + static_cast<int64_t>(double(plan_[next_].arrival_ms) *
                                                         c_.time_scale * 1e6);
        if (now < due) {
          next_due = due;
          break;
        }
        Status st = send_request(next_);
        if (!st.ok()) return st;
        now = monotonic_ns();
        res_.requests[next_].dispatched_ns = now;
        res_.dispatch_end_ns = now;
        inflight_.push_back(next_);
        schedule_abort(next_, now);
        ++next_;
      }
      if (kill_due()) continue;  // ask for the kill before anything else goes out
      send_due_aborts(now);
      finished_ += expire(now);
      int64_t wait_ns = 50'000'000;
      if (next_due > 0) wait_ns = std::min(wait_ns, next_due - now);
      if (!aborts_.empty()) wait_ns = std::min(wait_ns, aborts_.front().first - now);
      wait_ns = std::max<int64_t>(wait_ns, 0);
      auto text = sock_.recv(std::chrono::milliseconds((wait_ns + 999'999) / 1'000'000));
      while (text) {
        finished_ += on_frame(*text);
        text = sock_.recv(std::chrono::milliseconds(0));
      }
      write_progress(monotonic_ns());
      if (stop_requested()) return stopped();
    }
    log_event(LogLevel::kInfo, kComponent,
              fmt::format("all {} requests finished ({} given up by the router)", plan_.size(),
                          given_up_));
    return Status::Ok();
  }

  void shutdown_and_collect_stats() {
    const std::string bye = encode_shutdown();
    for (Role role : {Role::kPrefill, Role::kDecode}) {
      for (uint32_t in = 0; in < inst_.instances(role); ++in) {
        if (scale_.left(role, in)) continue;  // gone (--scale): its stats came when it left
        for (const auto& leader : inst_.leaders(role, in)) {
          Status st = send_patiently(sock_, leader, bye, std::chrono::milliseconds(2000));
          if (!st.ok()) {
            log_event(LogLevel::kWarning, kComponent, "cannot send shutdown to " + leader + ": " + st.str());
          }
        }
      }
    }
    const size_t groups = inst_.groups();
    const int64_t deadline = monotonic_ns() + seconds_ns(c_.stats_timeout_s);
    while (stats_from_.size() < groups && monotonic_ns() < deadline) {
      auto text = sock_.recv(std::chrono::milliseconds(100));
      if (text) on_frame(*text);
    }
    for (Role role : {Role::kPrefill, Role::kDecode}) {
      for (uint32_t in = 0; in < inst_.instances(role); ++in) {
        for (uint32_t dp = 0; dp < inst_.dp(role); ++dp) {
          if (stats_from_.count({role, in, dp})) continue;
          log_event(LogLevel::kWarning, kComponent,
                    fmt::format("no stats within {} s from the {} engine instance {} dp{}", c_.stats_timeout_s,
                                role_name(role), in, dp));
        }
      }
    }
  }

  const ReplayResults& results() {
    if (scale_.active()) res_.scale = scale_.records(res_.requests);
    return res_;
  }

  // `<results>.progress`: the results so far (same format), at most every 500 ms while something
  // finished; `kvferry replay` reads it for its progress display.
  void write_progress(int64_t now) {
    if (finished_ == progress_finished_ && progress_ns_ != 0) return;
    if (now - progress_ns_ < 500'000'000) return;
    progress_ns_ = now;
    progress_finished_ = finished_;
    (void)write_file_atomic(c_.results_path + ".progress", encode_results(res_));
  }

 private:
  // --- peer deaths -------------------------------------------------------------------------

  // Whether a room is in flight at the engine (and DP group) of `rank`: dispatched, and no
  // result from that engine yet. A kill then has a room to fail: the engine fails every room it
  // has not released while a rank is down (driver/engine.h), and a new leader knows none.
  bool rooms_at(const RankId& rank) {
    for (size_t i : inflight_) {
      const RequestOutcome& o = res_.requests[i];
      const auto& slot = rank.role == Role::kPrefill ? o.prefill : o.decode;
      if (!slot && dp_rank_for_room(o.room, uint32_t(leaders(rank.role).size())) == rank.dp_rank) return true;
    }
    return false;
  }
  bool kill_due() {
    Death* d = deaths_.current();
    return d && deaths_.kill_due(next_, rooms_at(d->rank));
  }

  // (peer_death_schedule.h) Asks the orchestrator for a due kill.
  Status advance_deaths(int64_t now) {
    Death* d = deaths_.current();
    const bool busy = d && rooms_at(d->rank);
    return deaths_.advance(now, next_, busy, plan_.size(), inflight_.size(), c_.ready_timeout_s,
                           [this](const std::string& frame) {
                             return send_patiently(sock_, c_.orchestrator, frame,
                                                   std::chrono::milliseconds(5000));
                           });
  }

  // A restarted engine leader: finish every in-flight request still waiting for that engine.
  void on_leader_back(Death& d, int64_t now) {
    const Role role = d.rank.role;
    size_t synthesized = 0;
    for (size_t i : std::vector<size_t>(inflight_)) {
      RequestOutcome& o = res_.requests[i];
      auto& slot = role == Role::kPrefill ? o.prefill : o.decode;
      if (slot || dp_rank_for_room(o.room, uint32_t(leaders(role).size())) != d.rank.dp_rank) continue;
      RoomResult r;
      r.role = role;
      r.room = o.room;
      r.state = KVPoll::Failed;
      r.code = ErrorCode::kPeerUnreachable;
      r.origin = d.rank.str();
      r.reason = "engine leader restarted";
      r.ranks_lost = role == Role::kPrefill ? c_.prefill_tp : c_.decode_tp;  // no rank reported
      r.first_failed_ns = d.killed_ns > 0 ? d.killed_ns : now;
      r.failed_all_ns = now;
      ++synthesized;
      finished_ += accept(r);
    }
    d.state = Death::State::kDone;
    log_event(LogLevel::kInfo, kComponent,
              fmt::format("{} engine leader {} is back; {} in-flight requests failed with it",
                          role_name(role), d.rank.str(), synthesized));
  }

  // --- scaling (router_scale.h) ---------------------------------------------------------------

  uint32_t initial(Role role) const { return initial_[role == Role::kPrefill ? 0 : 1]; }
  Status advance_scale(int64_t now) {
    if (!scale_.active()) return Status::Ok();
    return scale_.advance(
        now, inflight_, res_.requests,
        [this](const std::string& leader) {
          return send_patiently(sock_, leader, encode_leave(), std::chrono::milliseconds(2000));
        },
        c_.ready_timeout_s, c_.request_timeout_s);
  }

  // --- aborts --------------------------------------------------------------------------------

  void schedule_abort(size_t i, int64_t now) {
    const auto& f = plan_[i].fault;
    if (!f || f->kind != FaultKind::kAbort) return;
    const int64_t due = now + static_cast<int64_t>(abort_delay_ms(c_.seed, plan_[i].room) * 1e6);
    aborts_.insert(std::upper_bound(aborts_.begin(), aborts_.end(), std::pair{due, i}),
                   std::pair{due, i});
  }

  void send_due_aborts(int64_t now) {
    while (!aborts_.empty() && aborts_.front().first <= now) {
      const size_t i = aborts_.front().second;
      aborts_.erase(aborts_.begin());
      RequestOutcome& o = res_.requests[i];
      if (done_[i] || o.decode) continue;  // the room ended first: nothing to abort
      Status st = sock_.send(inst_.leader_for(Role::kDecode, o.decode_instance, o.room), encode_abort(o.room));
      if (!st.ok()) {
        log_event(LogLevel::kWarning, kComponent, "abort not sent: " + st.str(), LogFields{.room = o.room});
        continue;
      }
      o.abort_sent_ns = monotonic_ns();
      log_event(LogLevel::kDebug, kComponent, "abort sent", LogFields{.room = o.room});
    }
  }

  // --- requests and results ------------------------------------------------------------------

  Status send_request(size_t i) {
    RouterRequest q = plan_[i];
    RequestOutcome& o = res_.requests[i];
    // xPyD: the instances with the fewest outstanding requests (router_instances.h).
    std::tie(o.prefill_instance, o.decode_instance) = inst_.pick();
    if (q.fault && q.fault->at.role == Role::kDecode) {  // a decode rank's engine id is its instance
      q.fault->at.engine_id = o.decode_instance;
      o.fault = q.fault;
    }
    if (q.fault && q.fault->kind == FaultKind::kAbort) q.fault.reset();  // the router acts on it, not the engines
    const std::string prefill_frame = encode_request(q);
    if (o.prefill_instance < c_.prefill_bootstraps.size() && inst_.instances(Role::kPrefill) > 1) {
      q.prefill_bootstrap = c_.prefill_bootstraps[o.prefill_instance];
    }
    const std::string decode_frame = encode_request(q);
    for (const auto& [leader, frame] :
         {std::pair{inst_.leader_for(Role::kPrefill, o.prefill_instance, q.room), &prefill_frame},
          std::pair{inst_.leader_for(Role::kDecode, o.decode_instance, q.room), &decode_frame}}) {
      Status st = send_patiently(sock_, leader, *frame, std::chrono::milliseconds(10000));
      if (!st.ok()) return {st.code(), "cannot send a request to " + leader + ": " + st.message()};
    }
    inst_.dispatched(o.prefill_instance, o.decode_instance);
    scale_.on_dispatch(i, o.prefill_instance, o.decode_instance, monotonic_ns());
    log_event(LogLevel::kDebug, kComponent, "dispatched",
              LogFields{.room = plan_[i].room,
                        .extra = {{"input_tokens", std::to_string(plan_[i].input_tokens)},
                                  {"fault", plan_[i].fault ? plan_[i].fault->str() : ""}}});
    return Status::Ok();
  }

  // Gives up on requests past their deadline; returns how many finished that way.
  size_t expire(int64_t now) {
    size_t n = 0;
    const int64_t limit = seconds_ns(c_.request_timeout_s);
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      RequestOutcome& o = res_.requests[*it];
      if (now - o.dispatched_ns > limit) {
        o.router_failure = fmt::format("router: no result within {} s", c_.request_timeout_s);
        o.error = final_error(o);
        log_event(LogLevel::kDebug, kComponent, o.error, LogFields{.room = o.room});
        done_[*it] = true;
        finished_at_instances(o);
        ++given_up_;
        ++n;
        it = inflight_.erase(it);
      } else {
        ++it;
      }
    }
    return n;
  }

  // Handles one frame; returns 1 when it finished a request.
  size_t on_frame(const std::string& text) {
    // The orchestrator's frames and the engines' come to the same socket.
    if (auto pd = decode_peer_death_frame(text); pd.ok() && pd->has_value()) {
      deaths_.on_frame(**pd, next_);
      return 0;
    }
    auto f = decode_router_frame(text);
    if (!f.ok()) {
      log_event(LogLevel::kWarning, kComponent, "dropped a malformed frame: " + f.status().str());
      return 0;
    }
    if (f->stats) {
      // One frame per DP group; the engine's list holds every group's ranks.
      if (f->instance >= inst_.instances(f->stats_role) || f->dp_rank >= inst_.dp(f->stats_role) ||
          !stats_from_.insert({f->stats_role, f->instance, f->dp_rank}).second) {
        return 0;
      }
      scale_.on_stats(f->stats_role, f->instance, f->dp_rank, monotonic_ns());
      auto& all = f->stats_role == Role::kPrefill ? res_.prefill_stats : res_.decode_stats;
      if (!all) all.emplace();
      for (RankLeakStats s : *f->stats) {
        // Every prefill instance's ranks are engine 0: the report names them by instance
        // ("prefill1/tp0", as their log files), the way decode ranks name themselves.
        if (auto r = RankId::parse(s.rank); r && f->instance != 0) {
          r->engine_id = f->instance;
          s.rank = r->str();
        }
        all->push_back(std::move(s));
      }
      return 0;
    }
    if (f->type == "ready" && f->ready_role) {
      // A leader sends "ready" again only after it restarted.
      Death* d = deaths_.current();
      if (!f->ready_endpoint.empty() && f->dp_rank < inst_.dp(*f->ready_role) &&
          f->instance < inst_.instances(*f->ready_role)) {
        inst_.leaders(*f->ready_role, f->instance)[f->dp_rank] = f->ready_endpoint;
        if (scale_.on_ready(*f->ready_role, f->instance, f->dp_rank)) {  // a joining instance is up
          if (Status st = connect(*f->ready_role, f->instance); !st.ok()) {
            log_event(LogLevel::kWarning, kComponent, "joining instance: " + st.str());
          } else {
            scale_.joined(*f->ready_role, f->instance, monotonic_ns());
          }
        }
      }
      if (d && d->leader() && d->rank.role == *f->ready_role && d->rank.dp_rank == f->dp_rank && f->instance == 0 &&
          (d->state == Death::State::kKilled || d->state == Death::State::kRequested)) {
        on_leader_back(*d, monotonic_ns());  // adds what it finishes to finished_ itself
      }
      return 0;
    }
    if (f->up_rank) {
      deaths_.on_rank_up(*f->up_rank);
      return 0;
    }
    if (!f->result) {
      log_event(LogLevel::kWarning, kComponent, "unexpected '" + f->type + "' frame");
      return 0;
    }
    return accept(*f->result);
  }

  // Stores one engine's result; returns 1 when it finished the request.
  size_t accept(const RoomResult& r) {
    auto it = index_.find(r.room);
    if (it == index_.end()) {
      log_event(LogLevel::kDebug, kComponent, "result for an unknown room",
                LogFields{.room = r.room});
      return 0;
    }
    const size_t i = it->second;
    RequestOutcome& o = res_.requests[i];
    if (done_[i]) {
      log_event(LogLevel::kDebug, kComponent, "late result for a finished room",
                LogFields{.room = r.room});
      return 0;
    }
    auto& slot = r.role == Role::kPrefill ? o.prefill : o.decode;
    if (slot) {
      log_event(LogLevel::kDebug, kComponent, "duplicate result ignored", LogFields{.room = r.room});
      return 0;
    }
    slot = r;
    log_event(LogLevel::kDebug, kComponent,
              fmt::format("{} result {}", role_name(r.role), to_string(r.state)),
              LogFields{.room = r.room,
                        .code = r.code == ErrorCode::kOk ? "" : std::string(code_name(r.code)),
                        .origin = r.origin});
    if (!o.prefill || !o.decode) return 0;
    done_[i] = true;
    finished_at_instances(o);
    o.error = final_error(o);
    if (!o.error.empty()) {
      log_event(LogLevel::kDebug, kComponent, o.error, LogFields{.room = r.room});
    } else {
      deaths_.on_success(i);
    }
    res_.last_result_ns = monotonic_ns();
    inflight_.erase(std::remove(inflight_.begin(), inflight_.end(), i), inflight_.end());
    return 1;
  }

  // Instance 0's leaders (peer deaths: one instance per role, replay_config.h).
  std::vector<std::string>& leaders(Role role) { return inst_.leaders(role, 0); }
  void finished_at_instances(const RequestOutcome& o) {
    inst_.finished(Role::kPrefill, o.prefill_instance);
    inst_.finished(Role::kDecode, o.decode_instance);
  }

  const RouterConfig& c_;
  EngineInstances inst_;  // every instance's leaders and outstanding requests
  RouterScale scale_;     // --scale: joins and leaves
  uint32_t initial_[2];   // instances there from the start: prefill, decode
  std::set<std::tuple<Role, uint32_t, uint32_t>> stats_from_;  // (role, instance, DP rank) whose stats arrived
  ControlSocket& sock_;
  std::vector<RouterRequest> plan_;
  ReplayResults res_;
  std::unordered_map<uint64_t, size_t> index_;
  std::vector<bool> done_;
  std::vector<size_t> inflight_;
  std::vector<std::pair<int64_t, size_t>> aborts_;  // (due ns, request index), by due time
  PeerDeathSchedule deaths_;
  size_t next_ = 0;
  size_t finished_ = 0;
  size_t given_up_ = 0;
  int64_t progress_ns_ = 0;
  size_t progress_finished_ = 0;
};

}  // namespace

int run_router(const RouterConfig& given) {
  // --scale: the router knows every instance from the start; the joining ones are not live yet.
  auto scale = parse_scale(given.scale, given.prefill_instances, given.decode_instances);
  if (!scale.ok()) return fail(scale.status().message());
  const std::pair<uint32_t, uint32_t> initial{given.prefill_instances, given.decode_instances};
  RouterConfig c = given;
  c.prefill_instances = total_instances(*scale, Role::kPrefill, initial.first);
  c.decode_instances = total_instances(*scale, Role::kDecode, initial.second);
  auto trace = load_trace(c.trace_path, c.max_requests);
  if (!trace.ok()) return fail("cannot load the trace: " + trace.status().str());
  FaultPlan faults = fault_rate_plan(c.fault_rate);
  if (!c.faults.empty()) {
    auto parsed = parse_fault_plan(c.faults, c.prefill_tp, c.decode_tp, c.prefill_dp, c.decode_dp);
    if (!parsed.ok()) return fail(parsed.status().message());
    faults = *parsed;
  }
  auto deaths = faults.has_peer_death() && trace->size() >= 2
                    ? plan_peer_deaths(faults, trace->size(), c.seed, c.prefill_tp, c.decode_tp)
                    : std::vector<PlannedPeerDeath>{};
  if (!deaths.empty() && (c.prefill_instances > 1 || c.decode_instances > 1)) {
    return fail("peer deaths need one prefill and one decode instance");
  }
  if (c.prefill_instances > 1 && c.prefill_bootstraps.size() != c.prefill_instances) {
    return fail(fmt::format("{} prefill instances need {} --prefill-bootstrap addresses, got {}",
                            c.prefill_instances, c.prefill_instances, c.prefill_bootstraps.size()));
  }
  if (!deaths.empty() && c.orchestrator.empty()) {
    return fail("the fault plan has peer deaths but no --orchestrator endpoint");
  }
  install_stop_handler();
  auto listen = listen_address_for(c.endpoint, c.bind_host, c.advertise_host);
  if (!listen.ok()) return fail("--endpoint/--bind-host/--advertise-host: " + listen.status().message());
  auto sock = ControlSocket::bind(*listen);
  if (!sock.ok()) return fail("cannot bind " + c.endpoint + ": " + sock.status().str());
  if (!c.port_file.empty()) {
    Status st = write_port_file(c.port_file, endpoint_port((*sock)->endpoint()).value_or(0));
    if (!st.ok()) return fail(st.str());
  }
  Router router(c, **sock,
                plan_requests(*trace, c.seed, faults, c.prefill_tp, c.decode_tp, c.prefill_dp,
                              c.decode_dp),
                std::move(deaths), std::move(*scale), initial);
  log_event(LogLevel::kInfo, kComponent,
            fmt::format("router up on {}: {} requests, faults '{}', waiting for both engines",
                        (*sock)->endpoint(), trace->size(), faults.str()));
  Status st = router.wait_ready();
  if (st.ok()) st = router.dispatch_all();
  if (!st.ok() && stop_requested()) {  // what finished so far, for the partial report
    Status w = write_file_atomic(c.results_path, encode_results(router.results()));
    log_event(LogLevel::kInfo, kComponent, st.message() + (w.ok() ? "; results so far written" : "; " + w.str()));
    flush_logging();
    return 128 + stop_signal();
  }
  if (!st.ok()) return fail(st.str());
  router.shutdown_and_collect_stats();
  st = write_file_atomic(c.results_path, encode_results(router.results()));
  if (!st.ok()) return fail(st.str());
  log_event(LogLevel::kInfo, kComponent, "results written to " + c.results_path);
  flush_logging();
  return 0;
}

}  // namespace kvferry::replay
