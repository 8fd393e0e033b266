// The replay router (router.h): plan, dispatch with back-pressure, collect, shut down, write.
#include "replay/router.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "kvferry/control.h"
#include "kvferry/log.h"
#include "replay/results.h"

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
  Router(const RouterConfig& c, ControlSocket& sock, std::vector<RouterRequest> plan)
      : c_(c), sock_(sock), plan_(std::move(plan)) {
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
    bool prefill = false;
    bool decode = false;
    const int64_t deadline = monotonic_ns() + seconds_ns(c_.ready_timeout_s);
    while (!(prefill && decode)) {
      if (monotonic_ns() > deadline) {
        return {ErrorCode::kWaitingTimeout,
                fmt::format("engines not ready within {} s (prefill {}, decode {})",
                            c_.ready_timeout_s, prefill ? "ready" : "not ready",
                            decode ? "ready" : "not ready")};
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
      const uint32_t want = *f->ready_role == Role::kPrefill ? c_.prefill_tp : c_.decode_tp;
      if (f->ready_tp_size != want) {
        return {ErrorCode::kProtocolError,
                fmt::format("{} engine reports tp_size {}, expected {}",
                            role_name(*f->ready_role), f->ready_tp_size, want)};
      }
      (*f->ready_role == Role::kPrefill ? prefill : decode) = true;
      log_event(LogLevel::kInfo, kComponent,
                fmt::format("{} engine ready (tp {})", role_name(*f->ready_role), want));
    }
    return Status::Ok();
  }

  Status dispatch_all() {
    const int64_t start = monotonic_ns();
    res_.dispatch_start_ns = start;
    size_t next = 0;
    size_t finished = 0;
    const size_t max_inflight = std::max<uint32_t>(1, c_.max_inflight);
    while (finished < plan_.size()) {
      int64_t now = monotonic_ns();
      int64_t next_due = -1;
      while (next < plan_.size() && inflight_.size() < max_inflight) {
        const int64_t due = start + static_cast<int64_t>(double(plan_[next].arrival_ms) *
                                                         c_.time_scale * 1e6);
        if (now < due) {
          next_due = due;
          break;
        }
        Status st = send_request(next);
        if (!st.ok()) return st;
        now = monotonic_ns();
        res_.requests[next].dispatched_ns = now;
        res_.dispatch_end_ns = now;
        inflight_.push_back(next);
        ++next;
      }
      finished += expire(now);
      int64_t wait_ns = 50'000'000;
      if (next_due > 0) wait_ns = std::clamp<int64_t>(next_due - now, 0, wait_ns);
      auto text = sock_.recv(std::chrono::milliseconds(wait_ns / 1'000'000));
      while (text) {
        finished += on_frame(*text);
        text = sock_.recv(std::chrono::milliseconds(0));
      }
    }
    log_event(LogLevel::kInfo, kComponent,
              fmt::format("all {} requests finished ({} given up by the router)", plan_.size(),
                          given_up_));
    return Status::Ok();
  }

  void shutdown_and_collect_stats() {
    const std::string bye = encode_shutdown();
    for (const auto& leader : {c_.prefill_leader, c_.decode_leader}) {
      Status st = send_patiently(sock_, leader, bye, std::chrono::milliseconds(2000));
      if (!st.ok()) {
        log_event(LogLevel::kWarning, kComponent, "cannot send shutdown to " + leader + ": " + st.str());
      }
    }
    const int64_t deadline = monotonic_ns() + seconds_ns(c_.stats_timeout_s);
    while ((!res_.prefill_stats || !res_.decode_stats) && monotonic_ns() < deadline) {
      auto text = sock_.recv(std::chrono::milliseconds(100));
      if (text) on_frame(*text);
    }
    if (!res_.prefill_stats || !res_.decode_stats) {
      log_event(LogLevel::kWarning, kComponent,
                fmt::format("no stats within {} s from {}", c_.stats_timeout_s,
                            !res_.prefill_stats ? "the prefill engine" : "the decode engine"));
    }
  }

  const ReplayResults& results() const { return res_; }

 private:
  Status send_request(size_t i) {
    const std::string frame = encode_request(plan_[i]);
    for (const auto& leader : {c_.prefill_leader, c_.decode_leader}) {
      Status st = send_patiently(sock_, leader, frame, std::chrono::milliseconds(10000));
      if (!st.ok()) return {st.code(), "cannot send a request to " + leader + ": " + st.message()};
    }
    log_event(LogLevel::kDebug, kComponent, "dispatched",
              LogFields{.room = plan_[i].room,
                        .extra = {{"input_tokens", std::to_string(plan_[i].input_tokens)},
                                  {"fault", plan_[i].fault ? plan_[i].fault->kind + "@" +
                                                                 plan_[i].fault->at
                                                           : ""}}});
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
        log_event(LogLevel::kDebug, kComponent, o.router_failure, LogFields{.room = o.room});
        done_[*it] = true;
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
    auto f = decode_router_frame(text);
    if (!f.ok()) {
      log_event(LogLevel::kWarning, kComponent, "dropped a malformed frame: " + f.status().str());
      return 0;
    }
    if (f->stats) {
      (f->stats_role == Role::kPrefill ? res_.prefill_stats : res_.decode_stats) = *f->stats;
      return 0;
    }
    if (!f->result) {
      if (f->type != "ready") {
        log_event(LogLevel::kWarning, kComponent, "unexpected '" + f->type + "' frame");
      }
      return 0;
    }
    const RoomResult& r = *f->result;
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
    res_.last_result_ns = monotonic_ns();
    inflight_.erase(std::remove(inflight_.begin(), inflight_.end(), i), inflight_.end());
    return 1;
  }

  const RouterConfig& c_;
  ControlSocket& sock_;
  std::vector<RouterRequest> plan_;
  ReplayResults res_;
  std::unordered_map<uint64_t, size_t> index_;
  std::vector<bool> done_;
  std::vector<size_t> inflight_;
  size_t given_up_ = 0;
};

Status write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return {ErrorCode::kInternal, "cannot write " + tmp};
    out << text;
    if (!out.flush()) return {ErrorCode::kInternal, "cannot write " + tmp};
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return {ErrorCode::kInternal, "cannot rename " + tmp + " to " + path};
  }
  return Status::Ok();
}

}  // namespace

std::vector<RouterRequest> plan_requests(const std::vector<TraceRequest>& trace, uint64_t seed,
                                         double fault_rate, uint32_t prefill_tp,
                                         uint32_t decode_tp) {
  std::vector<TraceRequest> sorted = trace;
  std::stable_sort(sorted.begin(), sorted.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.arrival_ms < b.arrival_ms;
  });
  std::mt19937_64 rng(seed);
  std::unordered_set<uint64_t> used;
  std::vector<RouterRequest> plan;
  plan.reserve(sorted.size());
  uint64_t faults = 0;
  for (const auto& t : sorted) {
    RouterRequest q;
    do {
      q.room = rng() >> 1;  // 63 bits
    } while (q.room == 0 || !used.insert(q.room).second);
    q.input_tokens = t.input_tokens;
    q.output_tokens = t.output_tokens;
    q.arrival_ms = t.arrival_ms;
    const double u = double(rng() >> 11) * 0x1.0p-53;  // uniform [0, 1)
    if (u < fault_rate) {
      if (faults++ % 2 == 0) {
        q.fault = FaultSpec{"transfer", RankId{Role::kPrefill, 0, uint32_t(rng() % std::max(1u, prefill_tp)), 0}.str()};
      } else {
        q.fault = FaultSpec{"decode_fail", RankId{Role::kDecode, 0, uint32_t(rng() % std::max(1u, decode_tp)), 0}.str()};
      }
    }
    plan.push_back(std::move(q));
  }
  return plan;
}

int run_router(const RouterConfig& c) {
  auto trace = load_trace(c.trace_path, c.max_requests);
  if (!trace.ok()) return fail("cannot load the trace: " + trace.status().str());
  auto sock = ControlSocket::bind(c.endpoint);
  if (!sock.ok()) return fail("cannot bind " + c.endpoint + ": " + sock.status().str());
  Router router(c, **sock,
                plan_requests(*trace, c.seed, c.fault_rate, c.prefill_tp, c.decode_tp));
  log_event(LogLevel::kInfo, kComponent,
            fmt::format("router up on {}: {} requests, waiting for both engines",
                        (*sock)->endpoint(), trace->size()));
  Status st = router.wait_ready();
  if (!st.ok()) return fail(st.str());
  st = router.dispatch_all();
  if (!st.ok()) return fail(st.str());
  router.shutdown_and_collect_stats();
  st = write_file_atomically(c.results_path, encode_results(router.results()));
  if (!st.ok()) return fail(st.str());
  log_event(LogLevel::kInfo, kComponent, "results written to " + c.results_path);
  flush_logging();
  return 0;
}

}  // namespace kvferry::replay
