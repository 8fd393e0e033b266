// run_router against fake engine leaders (one thread, two ControlSockets): back-pressure,
// results, fault specs in both engines' requests, the per-request deadline, stats and shutdown.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "kvferry/control.h"
#include "process/process.h"
#include "replay/peer_death_frames.h"
#include "replay/results.h"
#include "replay/router.h"

namespace kvferry::replay {
namespace {

namespace fs = std::filesystem;

struct FakeEngines {
  size_t max_outstanding_seen = 0;      // per engine, requests without a result yet
  size_t requests_seen = 0;             // prefill side
  size_t faults_seen = 0;
  bool fault_specs_match = true;        // both engines got the same fault for every room
  bool got_shutdown = false;
  uint64_t never_answer_room = 0;       // 0: answer everything
  size_t total = 0;                     // requests the router will send: the last ones are answered
                                        // once all came, even fewer than `hold`
};

// Answers requests once `hold` are outstanding (or every one of `f.total` came), oldest first. By
// events only: a router slowed down by a busy host still finds exactly `hold` outstanding.
void run_fake(ControlSocket& prefill, ControlSocket& decode, const std::string& router,
              size_t hold, FakeEngines& f, std::atomic<bool>& stop) {
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    while (!stop && !(role == Role::kPrefill ? prefill : decode)
                         .send(router, encode_ready(role, 2)).ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::deque<RouterRequest> pending;  // prefill side's view; decode mirrors it
  std::map<uint64_t, std::optional<FaultSpec>> prefill_faults, decode_faults;
  size_t shutdowns = 0;
  while (!stop && shutdowns < 2) {
    for (ControlSocket* s : {&prefill, &decode}) {
      auto text = s->recv(std::chrono::milliseconds(s == &prefill ? 15 : 15));
      if (!text) continue;
      auto fr = decode_router_frame(*text);
      ASSERT_TRUE(fr.ok()) << fr.status().str();
      const Role role = s == &prefill ? Role::kPrefill : Role::kDecode;
      if (fr->type == "shutdown") {
        ++shutdowns;
        s->send(router, encode_stats(role, {{std::string(role_name(role)) + "/tp0", 0, 0, 0, 1}}));
        continue;
      }
      ASSERT_TRUE(fr->request.has_value());
      if (role == Role::kPrefill) {
        pending.push_back(*fr->request);
        ++f.requests_seen;
        if (fr->request->fault) ++f.faults_seen;
        prefill_faults[fr->request->room] = fr->request->fault;
      } else {
        // Compared once both sides' copies came (below): the router sends to both, and the
        // decode side's copy of a room may be read before the prefill side's.
        decode_faults[fr->request->room] = fr->request->fault;
      }
    }
    f.max_outstanding_seen = std::max(f.max_outstanding_seen, pending.size());
    if (!pending.empty() && (pending.size() >= hold || f.requests_seen >= f.total)) {
      RouterRequest q = pending.front();
      pending.pop_front();
      if (q.room == f.never_answer_room) continue;
      for (Role role : {Role::kPrefill, Role::kDecode}) {
        RoomResult r;
        r.role = role;
        r.room = q.room;
        if (q.fault) {
          r.state = KVPoll::Failed;
          r.code = ErrorCode::kInjected;
          r.origin = q.fault->at.str();
          r.reason = "fake fault";
          r.ranks_failed = 2;
        } else {
          r.state = KVPoll::Success;
          r.code = ErrorCode::kOk;
          r.first_send_ns = 100;
          r.success_ns = 200;
          r.bytes_transferred = role == Role::kPrefill ? q.input_tokens : 0;
          r.bytes_verified = role == Role::kDecode ? q.input_tokens : 0;
        }
        (role == Role::kPrefill ? prefill : decode).send(router, encode_result(r));
      }
    }
  }
  f.got_shutdown = shutdowns == 2;
  // Every room reached both engines, each with the same fault (or none).
  auto same = [](const std::optional<FaultSpec>& a, const std::optional<FaultSpec>& b) {
    return a.has_value() == b.has_value() && (!a || (a->kind == b->kind && a->at == b->at));
  };
  f.fault_specs_match =
      prefill_faults.size() == decode_faults.size() &&
      std::equal(prefill_faults.begin(), prefill_faults.end(), decode_faults.begin(),
                 [&](const auto& p, const auto& d) { return p.first == d.first && same(p.second, d.second); });
}

class RouterLoop : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvferry_router_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream t(dir_ / "trace.jsonl");
    for (int i = 0; i < 40; ++i) {
      t << "{\"timestamp\": " << i << ", \"input_length\": " << 1000 + i
        << ", \"output_length\": 5, \"hash_ids\": [1]}\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  RouterConfig config(ControlSocket& p, ControlSocket& d) {
    auto ports = process::pick_free_ports(1);
    EXPECT_TRUE(ports.ok());
    RouterConfig c;
    c.trace_path = (dir_ / "trace.jsonl").string();
    c.fault_rate = 0.25;
    c.seed = 9;
    c.prefill_tp = 2;
    c.decode_tp = 2;
    c.endpoint = "tcp://127.0.0.1:" + std::to_string((*ports)[0]);
    c.prefill_leaders = {p.endpoint()};
    c.decode_leaders = {d.endpoint()};
    c.max_inflight = 4;
    c.results_path = (dir_ / "results.json").string();
    c.ready_timeout_s = 10;
    c.stats_timeout_s = 5;
    return c;
  }

  ReplayResults read_results() {
    std::ifstream in(dir_ / "results.json");
    std::stringstream ss;
    ss << in.rdbuf();
    auto r = decode_results(ss.str());
    EXPECT_TRUE(r.ok()) << r.status().str();
    return r.ok() ? *r : ReplayResults{};
  }

  fs::path dir_;
};

TEST_F(RouterLoop, BackPressureResultsAndShutdown) {
  auto p = ControlSocket::bind("tcp://127.0.0.1:0");
  auto d = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(p.ok() && d.ok());
  RouterConfig c = config(**p, **d);
  FakeEngines fake;
  fake.total = 40;
  std::atomic<bool> stop{false};
  std::thread engines([&] { run_fake(**p, **d, c.endpoint, 4, fake, stop); });
  const int rc = run_router(c);
  stop = true;
  engines.join();
  ASSERT_EQ(rc, 0);
  EXPECT_TRUE(fake.got_shutdown);
  EXPECT_EQ(fake.requests_seen, 40u);
  EXPECT_EQ(fake.max_outstanding_seen, 4u);  // reached, never exceeded
  EXPECT_TRUE(fake.fault_specs_match);
  EXPECT_GT(fake.faults_seen, 0u);

  ReplayResults r = read_results();
  ASSERT_EQ(r.requests.size(), 40u);
  size_t faults = 0;
  for (const auto& q : r.requests) {
    ASSERT_TRUE(q.prefill.has_value());
    ASSERT_TRUE(q.decode.has_value());
    EXPECT_TRUE(q.router_failure.empty());
    EXPECT_GT(q.dispatched_ns, 0);
    if (q.fault) {
      ++faults;
      EXPECT_EQ(q.decode->state, KVPoll::Failed);
      EXPECT_EQ(q.decode->origin, q.fault->at.str());
    } else {
      EXPECT_EQ(q.decode->bytes_verified, q.input_tokens);
    }
  }
  EXPECT_EQ(faults, fake.faults_seen);
  EXPECT_GT(r.dispatch_start_ns, 0);
  EXPECT_GE(r.last_result_ns, r.dispatch_end_ns);
  ASSERT_TRUE(r.prefill_stats.has_value());
  ASSERT_TRUE(r.decode_stats.has_value());
  EXPECT_EQ((*r.decode_stats)[0].rank, "decode/tp0");
}

TEST_F(RouterLoop, GivesUpOnARequestAfterItsDeadline) {
  auto p = ControlSocket::bind("tcp://127.0.0.1:0");
  auto d = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(p.ok() && d.ok());
  RouterConfig c = config(**p, **d);
  c.max_requests = 6;
  c.fault_rate = 0;
  c.request_timeout_s = 0.5;
  const uint64_t victim = plan_requests({{.arrival_ms = 0, .input_tokens = 1000}}, c.seed, FaultPlan{}, 2, 2)[0].room;
  FakeEngines fake;
  fake.never_answer_room = victim;
  std::atomic<bool> stop{false};
  std::thread engines([&] { run_fake(**p, **d, c.endpoint, 1, fake, stop); });
  const int rc = run_router(c);
  stop = true;
  engines.join();
  ASSERT_EQ(rc, 0);
  ReplayResults r = read_results();
  ASSERT_EQ(r.requests.size(), 6u);
  size_t given_up = 0;
  for (const auto& q : r.requests) {
    if (q.room == victim) {
      EXPECT_EQ(q.router_failure, "router: no result within 0.5 s");
      EXPECT_FALSE(q.decode.has_value());
      ++given_up;
    } else {
      EXPECT_TRUE(q.router_failure.empty());
      EXPECT_TRUE(q.decode.has_value());
    }
  }
  EXPECT_EQ(given_up, 1u);
}

// Sends both engines' "ready" to the router (retrying until its socket is up).
void say_ready(ControlSocket& p, ControlSocket& d, const std::string& router, std::atomic<bool>& stop) {
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    while (!stop && !(role == Role::kPrefill ? p : d).send(router, encode_ready(role, 2)).ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

RoomResult result_of(Role role, uint64_t room, ErrorCode code, const std::string& origin) {
  RoomResult r;
  r.role = role;
  r.room = room;
  r.state = code == ErrorCode::kOk ? KVPoll::Success : KVPoll::Failed;
  r.code = code;
  r.origin = origin;
  r.reason = code == ErrorCode::kOk ? "" : "fake " + std::string(code_name(code));
  return r;
}

TEST_F(RouterLoop, AbortsGoToTheDecodeLeaderAfterTheDispatch) {
  auto p = ControlSocket::bind("tcp://127.0.0.1:0");
  auto d = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(p.ok() && d.ok());
  RouterConfig c = config(**p, **d);
  c.max_requests = 6;
  c.fault_rate = 0;
  c.faults = "abort:1";
  std::atomic<bool> stop{false};
  size_t faults_sent_to_engines = 0, aborts_at_prefill = 0, aborts_at_decode = 0;
  std::thread fake([&] {
    say_ready(**p, **d, c.endpoint, stop);
    size_t shutdowns = 0;
    while (!stop && shutdowns < 2) {
      for (ControlSocket* s : {&**p, &**d}) {
        auto text = s->recv(std::chrono::milliseconds(5));
        if (!text) continue;
        auto f = decode_router_frame(*text);
        ASSERT_TRUE(f.ok()) << f.status().str();
        const Role role = s == &**p ? Role::kPrefill : Role::kDecode;
        if (f->type == "shutdown") {
          ++shutdowns;
          s->send(c.endpoint, encode_stats(role, {}));
        } else if (f->request) {
          faults_sent_to_engines += f->request->fault.has_value();
        } else if (f->type == "abort") {
          ++(role == Role::kPrefill ? aborts_at_prefill : aborts_at_decode);
          // The decode leader fails the room; prefill learns it from decode.
          for (ControlSocket* e : {&**p, &**d}) {
            e->send(c.endpoint, encode_result(result_of(e == &**p ? Role::kPrefill : Role::kDecode,
                                                        f->abort_room, ErrorCode::kAborted,
                                                        "decode/tp0")));
          }
        }
      }
    }
  });
  const int rc = run_router(c);
  stop = true;
  fake.join();
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(faults_sent_to_engines, 0u);  // the router acts on aborts itself
  EXPECT_EQ(aborts_at_prefill, 0u);
  EXPECT_EQ(aborts_at_decode, 6u);
  for (const auto& q : read_results().requests) {
    ASSERT_TRUE(q.fault.has_value());
    EXPECT_EQ(q.fault->kind, FaultKind::kAbort);
    EXPECT_EQ(q.fault->at.str(), "decode/tp0");
    EXPECT_GE(q.abort_sent_ns - q.dispatched_ns, int64_t(abort_delay_ms(c.seed, q.room) * 1e6));
    EXPECT_EQ(q.error, "room " + std::to_string(q.room) + " failed: aborted at decode/tp0: fake aborted");
  }
}

// A killed engine leader: the router asks the orchestrator for the kill, sends nothing new until
// the restarted leader is ready again, then fails the requests the old leader took with it.
TEST_F(RouterLoop, RestartedLeaderFailsItsInFlightRequests) {
  auto p = ControlSocket::bind("tcp://127.0.0.1:0");
  auto d = ControlSocket::bind("tcp://127.0.0.1:0");
  auto o = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(p.ok() && d.ok() && o.ok());
  RouterConfig c = config(**p, **d);
  c.max_requests = 12;
  c.fault_rate = 0;
  c.faults = "peer_death@prefill/tp0:once";
  c.orchestrator = (*o)->endpoint();
  const size_t kill_after = plan_peer_deaths(*parse_fault_plan(c.faults, 2, 2), 12, c.seed, 2, 2)[0].after_dispatched;
  std::atomic<bool> stop{false};
  std::vector<uint64_t> lost;  // rooms the dead leader had
  size_t requests_while_dead = 0, kills = 0;
  int64_t ready_again_ns = 0, killed_ns = 0;
  std::thread fake([&] {
    say_ready(**p, **d, c.endpoint, stop);
    std::deque<uint64_t> pending;  // rooms both engines got and did not answer yet
    bool dead = false;
    size_t shutdowns = 0, prefill_requests = 0;
    // One frame from an engine leader's socket, if one comes within `wait`.
    auto take = [&](ControlSocket* s, std::chrono::milliseconds wait) {
      auto text = s->recv(wait);
      if (!text) return;
      auto f = decode_router_frame(*text);
      ASSERT_TRUE(f.ok()) << f.status().str();
      const Role role = s == &**p ? Role::kPrefill : Role::kDecode;
      if (f->type == "shutdown") {
        ++shutdowns;
        s->send(c.endpoint, encode_stats(role, {}));
      } else if (f->request && role == Role::kPrefill) {
        if (dead || (killed_ns && !ready_again_ns)) ++requests_while_dead;
        pending.push_back(f->request->room);
        ++prefill_requests;
      }
    };
    while (!stop && shutdowns < 2) {
      if (auto text = (*o)->recv(std::chrono::milliseconds(0))) {
        auto k = decode_peer_death_frame(*text);
        ASSERT_TRUE(k.ok() && k->has_value() && (*k)->type == "kill" && (*k)->rank == "prefill/tp0") << *text;
        const PeerDeathFrame* f = &**k;
        // The router dispatched exactly kill_after requests before it asked for the kill, but they
        // come on another socket: take them all first, so the leader really had them when it died.
        for (int64_t until = monotonic_ns() + 5'000'000'000; prefill_requests < kill_after && monotonic_ns() < until;)
          take(&**p, std::chrono::milliseconds(10));
        ASSERT_EQ(prefill_requests, kill_after);
        ++kills;
        dead = true;
        killed_ns = monotonic_ns();
        const int64_t now = killed_ns;
        (*o)->send(c.endpoint, encode_peer_death("killed", f->rank, now, ""));
        for (uint64_t room : pending) {  // decode fails them; the prefill leader lost them
          (*d)->send(c.endpoint, encode_result(result_of(Role::kDecode, room, ErrorCode::kPeerUnreachable, "prefill/tp0")));
          lost.push_back(room);
        }
        pending.clear();
      }
      const int64_t now = monotonic_ns();
      if (dead && now - killed_ns > 150'000'000) {
        dead = false;
        // On the leader's own socket (the router reads one socket, whoever sends): "restarted"
        // then reaches the router before the new leader's "ready", as the orchestrator's does.
        (*p)->send(c.endpoint, encode_peer_death("restarted", "prefill/tp0", now, ""));
        ready_again_ns = monotonic_ns();
        (*p)->send(c.endpoint, encode_ready(Role::kPrefill, 2));
      }
      for (ControlSocket* s : {&**p, &**d}) take(s, std::chrono::milliseconds(3));
      // Keep two rooms in flight; answer the rest once all 12 came (by events: however slowly the
      // router runs, the kill finds rooms in flight).
      if (!dead && (pending.size() > 2 || (!pending.empty() && prefill_requests == 12))) {
        for (ControlSocket* s : {&**p, &**d}) {
          s->send(c.endpoint, encode_result(result_of(s == &**p ? Role::kPrefill : Role::kDecode,
                                                      pending.front(), ErrorCode::kOk, "")));
        }
        pending.pop_front();
      }
    }
  });
  const int rc = run_router(c);
  stop = true;
  fake.join();
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(kills, 1u);
  EXPECT_EQ(requests_while_dead, 0u);
  ASSERT_FALSE(lost.empty());
  const ReplayResults r = read_results();
  ASSERT_EQ(r.requests.size(), 12u);
  size_t synthesized = 0, after = 0;
  for (size_t i = 0; i < r.requests.size(); ++i) {
    const auto& q = r.requests[i];
    ASSERT_TRUE(q.prefill && q.decode) << i;
    if (std::find(lost.begin(), lost.end(), q.room) != lost.end()) {
      ++synthesized;
      EXPECT_LT(i, kill_after);
      EXPECT_EQ(q.prefill->state, KVPoll::Failed);
      EXPECT_EQ(q.prefill->code, ErrorCode::kPeerUnreachable);
      EXPECT_EQ(q.prefill->origin, "prefill/tp0");
      EXPECT_EQ(q.prefill->reason, "engine leader restarted");
      EXPECT_EQ(q.prefill->first_failed_ns, killed_ns);
      EXPECT_NE(q.error.find("peer_unreachable at prefill/tp0"), std::string::npos) << q.error;
    } else {
      EXPECT_EQ(q.prefill->state, KVPoll::Success) << i;
      EXPECT_TRUE(q.error.empty());
    }
    if (i >= kill_after) {
      ++after;
      EXPECT_GT(q.dispatched_ns, ready_again_ns) << i;  // nothing went out while the leader was down
    }
  }
  EXPECT_EQ(synthesized, lost.size());
  EXPECT_EQ(after, 12 - kill_after);
}

// A killed follower: the router asks for the kill while rooms are in flight at its engine, sends
// nothing new until the orchestrator restarted it and its leader took it back ("rank_up"), and
// every request dispatched after that succeeds.
TEST_F(RouterLoop, KilledFollowerHoldsDispatchUntilItsLeaderTakesItBack) {
  auto p = ControlSocket::bind("tcp://127.0.0.1:0");
  auto d = ControlSocket::bind("tcp://127.0.0.1:0");
  auto o = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(p.ok() && d.ok() && o.ok());
  RouterConfig c = config(**p, **d);
  c.max_requests = 12;
  c.fault_rate = 0;
  c.faults = "peer_death@decode/tp1:once";
  c.orchestrator = (*o)->endpoint();
  std::atomic<bool> stop{false};
  std::vector<uint64_t> failed;  // rooms in flight at the kill: failed by the (fake) engines
  size_t requests_while_down = 0, kills = 0, pending_at_kill = 0;
  int64_t killed_ns = 0, up_ns = 0;
  std::thread fake([&] {
    say_ready(**p, **d, c.endpoint, stop);
    std::deque<uint64_t> pending;  // rooms the prefill side got and did not answer yet
    size_t shutdowns = 0, prefill_requests = 0;
    bool restarted = false;
    auto take = [&](ControlSocket* s, std::chrono::milliseconds wait) {
      auto text = s->recv(wait);
      if (!text) return;
      auto f = decode_router_frame(*text);
      ASSERT_TRUE(f.ok()) << f.status().str();
      const Role role = s == &**p ? Role::kPrefill : Role::kDecode;
      if (f->type == "shutdown") {
        ++shutdowns;
        s->send(c.endpoint, encode_stats(role, {}));
      } else if (f->request && role == Role::kPrefill) {
        if (killed_ns && !up_ns) ++requests_while_down;
        pending.push_back(f->request->room);
        ++prefill_requests;
      }
    };
    while (!stop && shutdowns < 2) {
      if (auto text = (*o)->recv(std::chrono::milliseconds(0))) {
        auto k = decode_peer_death_frame(*text);
        ASSERT_TRUE(k.ok() && k->has_value() && (*k)->type == "kill" && (*k)->rank == "decode/tp1") << *text;
        for (int64_t until = monotonic_ns() + 50'000'000; monotonic_ns() < until;) take(&**p, std::chrono::milliseconds(5));
        ++kills;
        pending_at_kill = pending.size();
        killed_ns = monotonic_ns();
        (*o)->send(c.endpoint, encode_peer_death("killed", "decode/tp1", killed_ns, ""));
        for (uint64_t room : pending) {  // the engines fail what was in flight, origin the dead rank
          for (ControlSocket* s : {&**p, &**d}) {
            s->send(c.endpoint, encode_result(result_of(s == &**p ? Role::kPrefill : Role::kDecode, room,
                                                        ErrorCode::kPeerUnreachable, "decode/tp1")));
          }
          failed.push_back(room);
        }
        pending.clear();
      }
      const int64_t now = monotonic_ns();
      if (killed_ns && !restarted && now - killed_ns > 150'000'000) {
        restarted = true;
        (*o)->send(c.endpoint, encode_peer_death("restarted", "decode/tp1", now, ""));
      }
      if (restarted && !up_ns && now - killed_ns > 400'000'000) {  // the follower said hello again
        up_ns = monotonic_ns();
        (*d)->send(c.endpoint, encode_rank_up(*RankId::parse("decode/tp1")));
      }
      for (ControlSocket* s : {&**p, &**d}) take(s, std::chrono::milliseconds(3));
      if (pending.size() > 2 || (!pending.empty() && prefill_requests == 12)) {
        for (ControlSocket* s : {&**p, &**d}) {
          s->send(c.endpoint, encode_result(result_of(s == &**p ? Role::kPrefill : Role::kDecode,
                                                      pending.front(), ErrorCode::kOk, "")));
        }
        pending.pop_front();
      }
    }
  });
  const int rc = run_router(c);
  stop = true;
  fake.join();
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(kills, 1u);
  EXPECT_GT(pending_at_kill, 0u);
  EXPECT_EQ(requests_while_down, 0u);
  const ReplayResults r = read_results();
  ASSERT_EQ(r.requests.size(), 12u);
  size_t after = 0;
  for (const auto& q : r.requests) {
    ASSERT_TRUE(q.prefill && q.decode);
    if (std::find(failed.begin(), failed.end(), q.room) != failed.end()) {
      EXPECT_LT(q.dispatched_ns, killed_ns);
      EXPECT_NE(q.error.find("peer_unreachable at decode/tp1"), std::string::npos) << q.error;
      continue;
    }
    EXPECT_TRUE(q.error.empty()) << q.error;
    if (q.dispatched_ns > killed_ns) {
      ++after;
      EXPECT_GT(q.dispatched_ns, up_ns);  // nothing went out before the rank was back
    }
  }
  EXPECT_GT(after, 0u);
}

TEST_F(RouterLoop, FailsWhenEnginesNeverReady) {
  auto p = ControlSocket::bind("tcp://127.0.0.1:0");
  auto d = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(p.ok() && d.ok());
  RouterConfig c = config(**p, **d);
  c.ready_timeout_s = 0.3;
  EXPECT_NE(run_router(c), 0);
  EXPECT_FALSE(fs::exists(dir_ / "results.json"));
}

TEST_F(RouterLoop, FailsOnABadTrace) {
  auto p = ControlSocket::bind("tcp://127.0.0.1:0");
  auto d = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(p.ok() && d.ok());
  RouterConfig c = config(**p, **d);
  c.trace_path = (dir_ / "missing.jsonl").string();
  EXPECT_NE(run_router(c), 0);
}

}  // namespace
}  // namespace kvferry::replay
