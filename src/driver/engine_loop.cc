#include "driver/engine_loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/stall_clock.h"
#include "core/stop_request.h"
#include "manager/log_policy.h"
#include "driver/metrics_hooks.h"
#include "driver/sync_codec.h"
#include "endpoint/peer_monitor.h"
#include "endpoint/waker.h"
#include "kvferry/log.h"
#include "kvferry/net.h"
#include "kvferry/port_file.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "engine";

// SIGTERM/SIGINT (core/stop_request.h): leave now, with the gauges as they are.
int stopped(EngineDriver& driver, int64_t now) {
  metrics_on_step(driver, driver.reports(now), now, true);
  log_event(LogLevel::kDebug, kComp, fmt::format("stopped by signal {}", stop_signal()));
  return 128 + stop_signal();
}

// The engine socket (kvferry/net.h): the leader's on engine_endpoint, a follower's on any port.
Result<std::unique_ptr<ControlSocket>> bind_engine_socket(const EngineLoopConfig& c, bool leader) {
  if (!leader) {
    ListenAddress own = make_listen_address(c.bind_host, c.advertise_host);
    own.port = c.follower_port;
    return ControlSocket::bind(own);
  }
  auto listen = listen_address_for(c.engine_endpoint, c.bind_host, c.advertise_host);
  if (!listen.ok()) return listen.status();
  return ControlSocket::bind(*listen);
}
}

EngineLoop::EngineLoop(EngineLoopConfig config, Manager& manager, EngineDriver& driver)
    : cfg_(std::move(config)), manager_(manager), driver_(driver) {}

int EngineLoop::run() {
  bool leader = cfg_.self.tp_rank == 0;
  auto sock = bind_engine_socket(cfg_, leader);
  if (!sock.ok()) {
    log_event(LogLevel::kCritical, kComp, "cannot bind engine socket: " + sock.status().str());
    return 2;
  }
  if (!cfg_.port_file.empty()) {
    Status st = write_port_file(cfg_.port_file, endpoint_port((*sock)->endpoint()).value_or(0));
    if (!st.ok()) {
      log_event(LogLevel::kCritical, kComp, "cannot write the port file: " + st.str());
      return 2;
    }
  }
  return leader ? run_leader(**sock) : run_follower(**sock);
}

void EngineLoop::pump_local(ControlSocket& engine) {
  std::vector<int> fds = manager_.wait_fds();
  fds.push_back(engine.fd());
  for (int fd : driver_.wait_fds()) fds.push_back(fd);
  wait_readable(fds.data(), static_cast<int>(fds.size()), 1);
  manager_.progress();  // control frames, transport completions, deadlines
  // The time after the wait: what the driver observes now is stamped now (first_seen_ns), not
  // with the time the loop went to sleep, which can be before the news that caused it arrived.
  driver_.pump(monotonic_ns());
}

void EngineLoop::flush_outbox(ControlSocket& engine) {
  size_t sent = 0;
  for (; sent < outbox_.size(); ++sent) {
    if (!engine.send(cfg_.router_endpoint, outbox_[sent]).ok()) break;
  }
  outbox_.erase(outbox_.begin(), outbox_.begin() + static_cast<long>(sent));
}

void EngineLoop::fan_out(ControlSocket& engine, const std::map<uint32_t, std::string>& to) {
  for (const SiblingFailure& f : driver_.take_failures_to_fan_out()) {
    std::string frame = encode_fail(f);
    for (const auto& [tp, ep] : to) {
      if (tp == cfg_.self.tp_rank) continue;
      Status s = engine.send(ep, frame);
      if (!s.ok())
        log_event(LogLevel::kDebug, kComp, fmt::format("fail frame to tp{} not queued: {}", tp, s.str()),
                  {.room = f.room});
    }
  }
}

void EngineLoop::on_sibling_fail(const SiblingFailure& f, int64_t now) {
  if (driver_.on_sibling_failure(f)) return;
  // Not here yet (the step creating it is on its way) or released already: keep it a while.
  if (early_fails_.size() >= kMaxEarlyFails) early_fails_.pop_front();
  early_fails_.emplace_back(now, f);
}

void EngineLoop::retry_early_fails(int64_t now) {
  std::erase_if(early_fails_, [&](const std::pair<int64_t, SiblingFailure>& e) {
    return now - e.first > kEarlyFailTtlNs || driver_.on_sibling_failure(e.second);
  });
}

bool EngineLoop::still_alive(const std::string& endpoint, int64_t now) {
  auto it = probes_.find(endpoint);
  if (it == probes_.end()) {
    if (probes_.size() >= kMaxProbes) probes_.clear();  // endpoints of members come and go
    it = probes_.emplace(endpoint, std::pair<int64_t, bool>{0, false}).first;
  }
  auto& [probed_ns, alive] = it->second;
  if (probed_ns == 0 || now - probed_ns >= PeerMonitor::kProbeIntervalMs * 1'000'000) {
    alive = PeerMonitor::endpoint_accepts(endpoint, 20);
    probed_ns = now;
  }
  return alive;
}

void EngineLoop::set_siblings(ControlSocket& engine, const std::vector<EngineMember>& members) {
  std::map<uint32_t, std::string> next;
  for (const EngineMember& m : members)
    if (m.tp_rank != cfg_.self.tp_rank && m.endpoint != cfg_.engine_endpoint) next[m.tp_rank] = m.endpoint;
  for (const auto& [tp, ep] : siblings_) {
    auto it = next.find(tp);
    if (it == next.end() || it->second != ep) engine.forget(ep);  // gone, or restarted elsewhere
  }
  std::string hi = encode_hi(cfg_.self.tp_rank);
  for (const auto& [tp, ep] : next) {
    auto it = siblings_.find(tp);
    if (it != siblings_.end() && it->second == ep) continue;
    // Opens the connection now, so a fail frame never waits for a connection to be set up.
    Status s = engine.send(ep, hi);
    if (!s.ok()) log_event(LogLevel::kDebug, kComp, fmt::format("hi to tp{} not queued: {}", tp, s.str()));
  }
  siblings_ = std::move(next);
}

int EngineLoop::run_leader(ControlSocket& engine) {
  const Role role = cfg_.self.role;
  std::map<uint32_t, std::string> followers;
  // Followers declared dead, until they say hello again, with their last endpoint: they get no
  // steps, except the shutdown step (a follower that was only stalled then still exits cleanly).
  std::map<uint32_t, std::string> down;
  std::set<uint32_t> asked;  // followers the outstanding step was sent to
  std::map<uint32_t, std::vector<RoomReport>> replies;
  std::map<uint32_t, RankLeakStats> follower_stats;
  std::vector<RouterRequest> pending;
  bool outstanding = false, shutdown_requested = false, shutdown_sent = false, router_seen = false;
  uint64_t seq = 0;
  int64_t last_step = 0, last_ready = 0, outstanding_since = 0;
  bool members_changed = false;  // the followers changed since the last step (fan-out targets)
  // A down follower's reply to the shutdown step is awaited at most this long (its stats join the
  // engine's; meanwhile ZeroMQ delivers the step, which closing the socket at once could drop).
  const int64_t down_shutdown_wait_ns = std::min<int64_t>(cfg_.peer_timeout_ms, 500) * 1'000'000;
  // Busy is not dead: a follower's silence counts only while this loop ran (see engine_loop.h).
  StallClock stall(kStallAllowanceNs);
  int64_t outstanding_stall = 0;  // stall.stalled_ns() when the outstanding step went out
  // Followers that replied to a step since their hello. A follower says hello only until its
  // first step, so a hello from one of these is a new process (restarted, possibly on the same
  // endpoint, docs/failure-model.md "Incarnations"): the rooms the old one had are lost.
  std::set<uint32_t> joined;
  std::map<uint32_t, std::string> down_reason;  // why each down follower was declared down
  std::map<uint32_t, int64_t> told_down;        // when it was last told so (a "down" frame)
  // The follower `tp` is dead (`why`): one line above debug (this engine's detection), its rooms
  // fail with it as origin (decide() while it is down); it gets no steps until it says hello.
  auto declare_down = [&](uint32_t tp, const std::string& why) {
    RankId dead{role, 0, tp, cfg_.self.dp_rank};
    log_event(failure_log_level(role, false, ErrorCode::kPeerUnreachable), kComp, why + "; its rooms fail",
              {.code = std::string(code_name(ErrorCode::kPeerUnreachable)), .origin = dead.str(),
               .extra = {{"peer", dead.str()}, {"event", "peer_dead"}}});
    driver_.on_rank_down(dead, why);
    down_reason[tp] = why;
    members_changed = true;
    // Its connection is dropped: the next frame to it (its rejoin, or the shutdown step) goes
    // through a new one that holds frames until it is up. The old one may still be reconnecting
    // to a process restarted on the same port, and refuse the first steps.
    auto it = followers.find(tp);
    if (it != followers.end()) {
      engine.forget(it->second);
      down[tp] = it->second;
      followers.erase(it);
    }
    joined.erase(tp);
  };
  for (;;) {
    int64_t now = monotonic_ns();
    stall.tick(now);
    pump_local(engine);
    if (stop_requested()) return stopped(driver_, now);
    for (int i = 0; i < 4096; ++i) {
      auto text = engine.recv(std::chrono::milliseconds(0));
      if (!text) break;
      auto f = decode_sync_frame(*text);
      if (!f.ok()) {
        log_event(LogLevel::kWarning, kComp, f.status().str());
        continue;
      }
      if (f->type == "hello") {
        if (followers.count(f->tp_rank) && joined.count(f->tp_rank)) {
          // Not waited out: its previous process will never answer the outstanding step.
          asked.erase(f->tp_rank);
          declare_down(f->tp_rank, fmt::format("{} restarted: it joined the engine again while a member",
                                               RankId{role, 0, f->tp_rank, cfg_.self.dp_rank}.str()));
          continue;  // it rejoins with its next hello, once the rooms of the old one failed
        }
        auto old = followers.find(f->tp_rank);
        if (old != followers.end() && old->second != f->endpoint) engine.forget(old->second);
        followers[f->tp_rank] = f->endpoint;
        members_changed = true;
        RankId r{role, 0, f->tp_rank, cfg_.self.dp_rank};
        if (down.erase(f->tp_rank) != 0) {
          down_reason.erase(f->tp_rank);
          told_down.erase(f->tp_rank);
          driver_.on_rank_up(r);
          outbox_.push_back(encode_rank_up(r));  // the router may hold rooms until it is back
          log_event(LogLevel::kDebug, kComp, r.str() + " rejoined the engine");
        }
      } else if (f->type == "reply") {
        auto was_down = down.find(f->tp_rank);
        if (was_down != down.end() && !shutdown_sent && now - told_down[f->tp_rank] > 200'000'000) {
          // Declared down, yet it answers (it had stalled, e.g. stopped or starved for longer than
          // kHungFactor x the timeout): tell it, so it fails its rooms and rejoins now rather than
          // after waiting out our silence.
          told_down[f->tp_rank] = now;
          Status s = engine.send(was_down->second, encode_down(down_reason[f->tp_rank]));
          if (!s.ok()) log_event(LogLevel::kDebug, kComp, "down frame not queued: " + s.str());
        }
        if (followers.count(f->tp_rank)) joined.insert(f->tp_rank);
        if (f->seq == seq && asked.count(f->tp_rank)) {
          replies[f->tp_rank] = std::move(f->rooms);
          follower_stats[f->tp_rank] = f->stats;
        }
      } else if (f->type == "fail") {
        on_sibling_fail(f->fail, now);
      } else if (f->type == "hi") {
        // followers open connections to each other only; nothing to do
      } else if (f->type == "abort") {
        router_seen = true;
        driver_.on_abort(f->room);
      } else {
        router_seen = true;
        auto rf = decode_router_frame(*text);
        if (!rf.ok()) {
          log_event(LogLevel::kWarning, kComp, "bad router frame: " + rf.status().str());
        } else if (rf->request) {
          pending.push_back(*rf->request);
        } else if (rf->type == "shutdown" || rf->type == "leave") {
          shutdown_requested = true;
          leaving_ = leaving_ || rf->type == "leave";
        }
      }
    }
    flush_outbox(engine);
    fan_out(engine, followers);
    if (followers.size() + down.size() + 1 < cfg_.tp_size) continue;  // still starting
    if (!router_seen && outbox_.empty() && now - last_ready > 200'000'000) {
      outbox_.push_back(encode_ready(role, cfg_.tp_size, cfg_.self.dp_rank, engine.endpoint(), cfg_.instance));
      last_ready = now;
    }
    if (outstanding) {
      size_t expected = 0, expected_down = 0, got_down = 0;
      for (uint32_t tp : asked) {
        expected += followers.count(tp);
        if (shutdown_sent && down.count(tp)) {
          ++expected_down;
          got_down += replies.count(tp);
        }
      }
      if (got_down < expected_down && now - outstanding_since <= down_shutdown_wait_ns) continue;
      // The shutdown step: a follower exits as soon as it answered, and its answer may be lost
      // with it (closing drops what ZeroMQ had not written yet). One whose engine socket no longer
      // accepts has exited: it is done, not dead (its stats are missing from the engine's).
      if (shutdown_sent && replies.size() - got_down < expected) {
        for (uint32_t tp : asked) {
          auto f = followers.find(tp);
          if (f == followers.end() || replies.count(tp) || still_alive(f->second, now)) continue;
          replies[tp];  // counted as answered, with no rooms and no stats
          log_event(LogLevel::kDebug, kComp, fmt::format("tp{} exited before its answer to the shutdown step arrived", tp));
        }
      }
      if (replies.size() - got_down < expected) {
        const int64_t silent = stall.silence(now, outstanding_since, outstanding_stall);
        const int64_t timeout_ns = cfg_.peer_timeout_ms * 1'000'000;
        if (silent <= timeout_ns) continue;
        // Followers that did not answer are dead, unless their engine socket still accepts
        // connections (alive, not scheduled) and they are not yet silent for kHungFactor x the
        // timeout: the engine fails the dead ones' rooms and goes on; it waits for the busy ones.
        bool waiting = false;
        for (auto it = followers.begin(); it != followers.end();) {
          if (replies.count(it->first) || !asked.count(it->first)) {
            ++it;
            continue;
          }
          if (silent <= PeerMonitor::kHungFactor * timeout_ns && still_alive(it->second, now)) {
            waiting = true;
            ++it;
            continue;
          }
          const uint32_t tp = it->first;
          ++it;
          declare_down(tp, fmt::format("{} stopped answering the engine's per-step agreement for {} ms",
                                       RankId{role, 0, tp, cfg_.self.dp_rank}.str(),
                                       (now - outstanding_since) / 1'000'000));
        }
        if (waiting) continue;
      }
      outstanding = false;
      if (shutdown_sent) {
        std::vector<RankLeakStats> stats{driver_.leak_stats()};
        for (auto& [tp, st] : follower_stats) stats.push_back(st);
        outbox_.push_back(encode_stats(role, stats, cfg_.self.dp_rank, cfg_.instance));
        for (int i = 0; i < 200 && !outbox_.empty(); ++i) {
          flush_outbox(engine);
          if (!outbox_.empty()) wait_readable(nullptr, 0, 10);
        }
        metrics_on_step(driver_, driver_.reports(now), now, true);
        log_event(LogLevel::kDebug, kComp, "shutdown");
        return 0;
      }
    }
    bool busy = !driver_.idle() || !pending.empty();
    int64_t interval = (busy ? cfg_.step_interval_us : cfg_.idle_step_interval_us) * 1000;
    if (now - last_step < interval && !shutdown_requested) continue;
    // Gather: own reports plus every follower's, by room.
    std::map<uint64_t, std::vector<RoomReport>> by_room;
    std::vector<RoomReport> own = driver_.reports(now);
    metrics_on_step(driver_, own, now, false);
    for (RoomReport& r : own) by_room[r.room].push_back(std::move(r));
    for (RoomReport& r : driver_.reclaim_reports()) by_room[r.room].push_back(std::move(r));
    for (auto& [tp, list] : replies)
      for (RoomReport& r : list) by_room[r.room].push_back(std::move(r));
    replies.clear();
    std::vector<RoomResult> results;
    std::vector<Decision> decisions = driver_.decide(by_room, std::move(pending), now, &results);
    pending.clear();
    for (const Decision& d : decisions) driver_.apply(d);
    for (const RoomResult& r : results) outbox_.push_back(encode_result(r));
    flush_outbox(engine);
    retry_early_fails(now);
    ++seq;
    std::vector<EngineMember> members;
    for (const auto& [tp, ep] : followers) members.push_back({tp, ep});
    std::string step =
        encode_step(seq, shutdown_requested, decisions, members_changed ? &members : nullptr, leaving_);
    members_changed = false;
    asked.clear();
    for (auto& [tp, ep] : followers) {
      asked.insert(tp);
      Status s = engine.send(ep, step);
      if (!s.ok()) log_event(LogLevel::kWarning, kComp, fmt::format("step to tp{} not queued: {}", tp, s.str()));
    }
    if (shutdown_requested) {
      // A follower marked down may only have stalled: it must still learn that the run is over.
      for (auto& [tp, ep] : down) {
        asked.insert(tp);
        Status s = engine.send(ep, step);
        if (!s.ok())
          log_event(LogLevel::kDebug, kComp, fmt::format("shutdown step to down tp{} not queued: {}", tp, s.str()));
      }
    }
    fan_out(engine, followers);  // failures first seen while applying (e.g. at admission)
    shutdown_sent = shutdown_requested;
    outstanding = true;
    outstanding_since = now;
    outstanding_stall = stall.stalled_ns();
    last_step = now;
  }
}

int EngineLoop::run_follower(ControlSocket& engine) {
  std::string hello = encode_hello(cfg_.self.tp_rank, engine.endpoint());
  int64_t last_hello = 0, last_step = 0;
  StallClock stall(kStallAllowanceNs);  // the leader's silence counts only while this loop ran
  int64_t step_stall = 0;               // stall.stalled_ns() at last_step
  std::set<uint64_t> orphans;  // rooms failed because the leader died, not yet released
  // Out of the engine (its leader died, or declared this rank down): every room fails here with
  // `origin` and is released locally once drained; then this rank says hello again and waits for
  // a leader to take it back.
  auto orphan_rooms = [&](const RankId& origin, const std::string& why, LogLevel level) {
    const int64_t now = monotonic_ns();
    log_event(level, kComp, why + "; its rooms fail",
              {.code = std::string(code_name(ErrorCode::kPeerUnreachable)), .origin = origin.str(),
               .extra = {{"peer", origin.str()}, {"event", "peer_dead"}}});
    for (const RoomReport& r : driver_.reports(now)) {
      Decision f;
      f.op = Decision::Op::kFail;
      f.room = r.room;
      f.code = ErrorCode::kPeerUnreachable;
      f.origin = origin.str();
      f.reason = why;
      f.first_seen_ns = now;
      driver_.apply(f);
      orphans.insert(r.room);
    }
    engine.forget(cfg_.engine_endpoint);
    last_step = 0;
    last_hello = 0;
  };
  // The fan-out goes to the other followers, and to the leader while it is alive.
  auto fan_out_targets = [&] {
    std::map<uint32_t, std::string> to = siblings_;
    if (last_step != 0) to[0] = cfg_.engine_endpoint;
    return to;
  };
  for (;;) {
    int64_t now = monotonic_ns();
    stall.tick(now);
    pump_local(engine);
    if (stop_requested()) return stopped(driver_, now);
    fan_out(engine, fan_out_targets());
    if (last_step == 0 && orphans.empty() && now - last_hello > 100'000'000) {
      (void)engine.send(cfg_.engine_endpoint, hello);
      last_hello = now;
    }
    for (int i = 0; i < 64; ++i) {
      auto text = engine.recv(std::chrono::milliseconds(0));
      if (!text) break;
      auto f = decode_sync_frame(*text);
      if (!f.ok()) {
        log_event(LogLevel::kWarning, kComp, "rejected engine frame: " + f.status().str(),
                  {.code = std::string(code_name(ErrorCode::kProtocolError))});
        continue;
      }
      if (f->type == "fail") {
        on_sibling_fail(f->fail, monotonic_ns());
        continue;
      }
      if (f->type == "hi") continue;
      if (f->type == "down") {
        // The leader declared this rank down (it stalled past the leader's patience): its rooms
        // failed there with this rank as origin, and that engine's one line was the leader's.
        if (last_step != 0) {
          orphan_rooms(RankId{cfg_.self.role, 0, cfg_.self.tp_rank, cfg_.self.dp_rank}, f->reason, LogLevel::kDebug);
          break;
        }
        continue;
      }
      if (f->type != "step") {
        log_event(LogLevel::kWarning, kComp, "unexpected engine frame of type " + f->type);
        continue;
      }
      last_step = monotonic_ns();
      step_stall = stall.stalled_ns();
      if (f->has_members) set_siblings(engine, f->members);
      for (const Decision& d : f->decisions) driver_.apply(d);
      // The step's releases dropped handles: the manager releases their rooms now, before this
      // rank reports (the shutdown step's leak statistics may follow in the same batch).
      manager_.progress();
      driver_.pump(last_step);
      retry_early_fails(last_step);
      fan_out(engine, fan_out_targets());
      std::vector<RoomReport> own = driver_.reports(last_step);
      metrics_on_step(driver_, own, last_step, f->shutdown);
      for (RoomReport& r : driver_.reclaim_reports()) own.push_back(std::move(r));
      Status s = engine.send(cfg_.engine_endpoint,
                             encode_reply(f->seq, cfg_.self.tp_rank, own, driver_.leak_stats()));
      if (!s.ok()) log_event(LogLevel::kWarning, kComp, "reply not queued: " + s.str());
      if (f->shutdown) {
        log_event(LogLevel::kDebug, kComp, "shutdown");
        leaving_ = f->leave;
        return 0;
      }
    }
    now = monotonic_ns();
    // A long step (applying decisions, pumping) is this loop's own stall: no frame of the leader's
    // could be read meanwhile, so it does not count as the leader's silence.
    stall.tick(now);
    // 1.5 times the leader's patience with a follower: a leader busy waiting out a dead follower is
    // not itself dead.
    const int64_t leader_silence = last_step != 0 ? stall.silence(now, last_step, step_stall) : 0;
    const int64_t leader_timeout_ns = 3 * cfg_.peer_timeout_ms * 500'000;
    if (last_step != 0 && leader_silence > leader_timeout_ns &&
        (leader_silence > PeerMonitor::kHungFactor * leader_timeout_ns || !still_alive(cfg_.engine_endpoint, now))) {
      // The leader is dead: no agreement is possible, so every room fails here with the leader as
      // origin and is released locally; then wait for a (restarted) leader to take us back.
      RankId leader{cfg_.self.role, 0, 0, cfg_.self.dp_rank};
      std::string why = fmt::format("{} stopped sending the engine's per-step agreement for {} ms", leader.str(),
                                    (now - last_step) / 1'000'000);
      // One line per detecting engine: the lowest follower speaks for it.
      LogLevel level = cfg_.self.tp_rank == 1 ? failure_log_level(cfg_.self.role, false, ErrorCode::kPeerUnreachable)
                                              : LogLevel::kDebug;
      orphan_rooms(leader, why, level);
      continue;
    }
    // Rooms of a dead leader are released here once no peer write can reach them (or the drain
    // deadline passed); only then does this rank rejoin, so a new leader finds it empty.
    if (!orphans.empty()) {
      for (const RoomReport& r : driver_.reports(now))
        if (orphans.count(r.room) && r.drained) {
          driver_.apply({Decision::Op::kRelease, r.room});
          orphans.erase(r.room);
        }
      continue;
    }
  }
}

}  // namespace kvferry
