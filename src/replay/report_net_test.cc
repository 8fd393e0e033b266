// The report's restart checks (report_net.cc).
#include <gtest/gtest.h>

#include "replay/report.h"

namespace kvferry::replay {
namespace {

constexpr int64_t kMs = 1'000'000;

RequestOutcome request(uint64_t room, int64_t dispatched_ns, bool ok, int64_t done_ns) {
  RequestOutcome q;
  q.room = room;
  q.dispatched_ns = dispatched_ns;
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    RoomResult r;
    r.role = role;
    r.room = room;
    r.state = ok ? KVPoll::Success : KVPoll::Failed;
    r.code = ok ? ErrorCode::kOk : ErrorCode::kPeerUnreachable;
    r.origin = ok ? "" : "decode/tp0";
    r.reason = ok ? "" : "decode/tp0 unreachable";
    r.success_ns = ok ? done_ns : 0;
    r.first_failed_ns = ok ? 0 : done_ns;
    r.ranks_failed = ok ? 0 : 1;
    (role == Role::kPrefill ? q.prefill : q.decode) = r;
  }
  return q;
}

PeerDeathRecord restart_of_decode() {
  PeerDeathRecord d;
  d.rank = "decode/tp0";
  d.killed_ns = 1000 * kMs;
  d.restarted = true;
  d.restarted_ns = 2500 * kMs;
  d.same_ports = true;
  return d;
}

LogScan logs_with_stale(std::vector<int64_t> at_ns) {
  LogScan logs;
  logs.lines = 1;
  for (int64_t t : at_ns) logs.stale_refused.push_back({"prefill/tp0", "decode/tp0", "RoomStatus", t});
  return logs;
}

TEST(RestartChecks, RoomsAfterTheRestartSucceedAndStaleMessagesAreCounted) {
  ReplayResults res;
  res.requests.push_back(request(1, 500 * kMs, true, 600 * kMs));     // before the kill
  res.requests.push_back(request(2, 900 * kMs, false, 1800 * kMs));   // the death's
  res.requests.push_back(request(3, 2600 * kMs, false, 2700 * kMs));  // before it was back
  res.requests.push_back(request(4, 2800 * kMs, true, 3100 * kMs));   // back: 600 ms after the restart
  res.requests.push_back(request(5, 3000 * kMs, true, 3200 * kMs));
  Report rep = build_report(res, logs_with_stale({400 * kMs, 1500 * kMs, 2600 * kMs}), {restart_of_decode()});
  ASSERT_EQ(rep.peer_deaths.size(), 1u);
  const PeerDeathEntry& e = rep.peer_deaths[0];
  EXPECT_EQ(e.rooms_after_restart, 3u);
  EXPECT_EQ(e.rooms_after_restart_failed, 0u);  // room 3 was dispatched before the rank was back
  EXPECT_DOUBLE_EQ(e.first_success_after_restart_ms, 600.0);
  EXPECT_EQ(e.stale_refused, 2u);  // from the kill on
  std::vector<std::string> p;
  restart_problems(rep, p);
  EXPECT_TRUE(p.empty()) << p.front();
}

TEST(RestartChecks, AFailureOnceTheRankIsBackIsAProblem) {
  ReplayResults res;
  res.requests.push_back(request(4, 2800 * kMs, true, 3100 * kMs));
  res.requests.push_back(request(5, 3000 * kMs, false, 3200 * kMs));
  Report rep = build_report(res, logs_with_stale({}), {restart_of_decode()});
  EXPECT_EQ(rep.peer_deaths[0].rooms_after_restart_failed, 1u);
  std::vector<std::string> p;
  restart_problems(rep, p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("1 of 2 rooms dispatched after it failed"), std::string::npos) << p[0];

  ReplayResults none_ok;
  none_ok.requests.push_back(request(6, 2800 * kMs, false, 3100 * kMs));
  Report rep2 = build_report(none_ok, logs_with_stale({}), {restart_of_decode()});
  EXPECT_DOUBLE_EQ(rep2.peer_deaths[0].first_success_after_restart_ms, -1.0);
  p.clear();
  restart_problems(rep2, p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("no room dispatched after it succeeded"), std::string::npos) << p[0];
}

}  // namespace
}  // namespace kvferry::replay
