#include "replay/report.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace kvferry::replay {
namespace {

RoomResult ok_result(Role role, uint64_t room) {
  RoomResult r;
  r.role = role;
  r.room = room;
  r.state = KVPoll::Success;
  r.code = ErrorCode::kOk;
  return r;
}

RoomResult failed_result(Role role, uint64_t room, ErrorCode code, const std::string& origin) {
  RoomResult r;
  r.role = role;
  r.room = room;
  r.state = KVPoll::Failed;
  r.code = code;
  r.origin = origin;
  r.reason = "because " + origin;
  r.ranks_failed = 1;  // the one rank of its engine (build_report's default cluster is 1+1)
  return r;
}

RequestOutcome success(uint64_t room, int64_t send_ns, int64_t done_ns, uint64_t bytes) {
  RequestOutcome q;
  q.room = room;
  q.input_tokens = 100;
  q.prefill = ok_result(Role::kPrefill, room);
  q.prefill->first_send_ns = send_ns;
  q.prefill->bytes_transferred = bytes;
  q.decode = ok_result(Role::kDecode, room);
  q.decode->success_ns = done_ns;
  q.decode->bytes_verified = bytes;
  return q;
}

TEST(Percentiles, NearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // unsorted input
  Percentiles p = percentiles(v);
  EXPECT_EQ(p.count, 100u);
  EXPECT_DOUBLE_EQ(p.p50, 50);
  EXPECT_DOUBLE_EQ(p.p90, 90);
  EXPECT_DOUBLE_EQ(p.p99, 99);
  EXPECT_DOUBLE_EQ(p.max, 100);
  Percentiles one = percentiles({7.5});
  EXPECT_DOUBLE_EQ(one.p50, 7.5);
  EXPECT_DOUBLE_EQ(one.p99, 7.5);
  Percentiles three = percentiles({3, 1, 2});
  EXPECT_DOUBLE_EQ(three.p50, 2);
  EXPECT_DOUBLE_EQ(three.p90, 3);
  Percentiles none = percentiles({});
  EXPECT_EQ(none.count, 0u);
  EXPECT_DOUBLE_EQ(none.max, 0);
}

TEST(BuildReport, ClassifiesAndSums) {
  ReplayResults res;
  res.dispatch_start_ns = 1'000'000'000;
  res.last_result_ns = 3'000'000'000;  // 2 s
  res.requests.push_back(success(1, 100'000'000, 110'000'000, 3'000'000'000));  // 10 ms
  res.requests.push_back(success(2, 200'000'000, 230'000'000, 1'000'000'000));  // 30 ms
  // Rejected by decode (resource exhausted), prefill failed as a consequence.
  RequestOutcome rej;
  rej.room = 3;
  rej.input_tokens = 999999;
  rej.decode = failed_result(Role::kDecode, 3, ErrorCode::kResourceExhausted, "decode/tp0");
  rej.decode->rejected = true;
  rej.decode->reason = "needs 9000 pages, pool has 100";
  rej.prefill = failed_result(Role::kPrefill, 3, ErrorCode::kResourceExhausted, "decode/tp0");
  res.requests.push_back(rej);
  // Unexpected failure.
  RequestOutcome bad;
  bad.room = 4;
  bad.prefill = failed_result(Role::kPrefill, 4, ErrorCode::kPeerUnreachable, "prefill/tp1");
  bad.decode = failed_result(Role::kDecode, 4, ErrorCode::kPeerUnreachable, "prefill/tp1");
  bad.decode->bytes_mismatched = 0;
  res.requests.push_back(bad);

  LogScan logs;
  logs.lines = 10;
  Report r = build_report(res, logs);
  EXPECT_EQ(r.total, 4u);
  EXPECT_EQ(r.succeeded, 2u);
  EXPECT_EQ(r.rejected, 1u);
  EXPECT_EQ(r.failed, 1u);
  EXPECT_EQ(r.succeeded + r.failed + r.rejected, r.total);
  EXPECT_EQ(r.bytes_transferred, 4'000'000'000u);
  EXPECT_EQ(r.bytes_verified, 4'000'000'000u);
  EXPECT_DOUBLE_EQ(r.transfer_seconds, 2.0);
  EXPECT_DOUBLE_EQ(r.throughput_gb_per_s, 2.0);
  EXPECT_EQ(r.transfer_latency_ms.count, 2u);
  EXPECT_DOUBLE_EQ(r.transfer_latency_ms.p50, 10.0);
  EXPECT_DOUBLE_EQ(r.transfer_latency_ms.max, 30.0);
  ASSERT_EQ(r.rejected_requests.size(), 1u);
  EXPECT_EQ(r.rejected_requests[0].room, "3");
  EXPECT_EQ(r.rejected_requests[0].input_tokens, 999999u);
  EXPECT_EQ(r.rejected_requests[0].reason, "needs 9000 pages, pool has 100");
  ASSERT_EQ(r.unexpected_failures.size(), 1u);
  EXPECT_EQ(r.unexpected_failures[0].room, "4");
  EXPECT_EQ(r.unexpected_failures[0].origin, "prefill/tp1");
  EXPECT_EQ(r.unexpected_failures[0].code, "peer_unreachable");
  EXPECT_TRUE(r.faults.empty());
  auto problems = r.problems();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("1 unexpected failures"), std::string::npos) << problems[0];
}

TEST(BuildReport, FaultAttributionAndLineCounts) {
  ReplayResults res;
  // Fault 1: transfer at prefill/tp1, both engines agree, one line above debug.
  RequestOutcome f1;
  f1.room = 77;
  f1.fault = *fault_from_names("transfer", "prefill/tp1");
  f1.prefill = failed_result(Role::kPrefill, 77, ErrorCode::kTransferError, "prefill/tp1");
  f1.prefill->first_failed_ns = 1'000'000;
  f1.prefill->failed_all_ns = 3'000'000;
  f1.prefill->ranks_failed = 2;
  f1.decode = failed_result(Role::kDecode, 77, ErrorCode::kTransferError, "prefill/tp1");
  f1.decode->first_failed_ns = 1'000'000;
  f1.decode->failed_all_ns = 5'500'000;
  f1.decode->ranks_failed = 2;
  res.requests.push_back(f1);
  // Fault 2: decode_fail at decode/tp0 but the engines disagree: misattributed.
  RequestOutcome f2;
  f2.room = 78;
  f2.fault = *fault_from_names("decode_fail", "decode/tp0");
  f2.prefill = failed_result(Role::kPrefill, 78, ErrorCode::kWaitingTimeout, "prefill/tp0");
  f2.decode = failed_result(Role::kDecode, 78, ErrorCode::kInjected, "decode/tp0");
  res.requests.push_back(f2);
  // Fault 3: the room succeeded anyway: not applied.
  RequestOutcome f3 = success(79, 1, 2, 10);
  f3.fault = *fault_from_names("transfer", "prefill/tp0");
  res.requests.push_back(f3);
  // Fault 4: the router gave up: failed, origin "router", misattributed.
  RequestOutcome f4;
  f4.room = 80;
  f4.fault = *fault_from_names("decode_fail", "decode/tp1");
  f4.router_failure = "router: no result within 300 s";
  res.requests.push_back(f4);

  LogScan logs;
  logs.lines = 20;
  logs.above_debug_by_room = {{"77", 1}, {"78", 2}};
  Report r = build_report(res, logs);
  EXPECT_EQ(r.failed, 3u);
  EXPECT_EQ(r.succeeded, 1u);
  ASSERT_EQ(r.faults.size(), 3u);
  ASSERT_EQ(r.faults_not_applied.size(), 1u);
  EXPECT_EQ(r.faults_not_applied[0].room, "79");
  EXPECT_EQ(r.faults_not_applied[0].outcome, "succeeded");

  const FaultEntry& a = r.faults[0];
  EXPECT_EQ(a.room, "77");
  EXPECT_EQ(a.kind, "transfer");
  EXPECT_EQ(a.injected_at, "prefill/tp1");
  EXPECT_EQ(a.observed_origin, "prefill/tp1");
  EXPECT_TRUE(a.attributed());
  EXPECT_EQ(a.code, "transfer_error");
  EXPECT_EQ(a.reason, "because prefill/tp1");
  EXPECT_EQ(a.lines_above_debug, 1u);
  EXPECT_EQ(a.ranks_failed, 4u);
  EXPECT_DOUBLE_EQ(a.time_to_all_failed_ms, 4.5);
  EXPECT_EQ(a.ranks_total, 2u);  // build_report's default cluster is 1+1
  EXPECT_EQ(a.ranks_concluded, 0u);
  EXPECT_TRUE(a.concluded_engines.empty());

  const FaultEntry& b = r.faults[1];
  EXPECT_FALSE(b.attributed());
  EXPECT_NE(b.observed_origin.find("prefill/tp0"), std::string::npos);
  EXPECT_NE(b.observed_origin.find("decode/tp0"), std::string::npos);
  EXPECT_EQ(b.lines_above_debug, 2u);

  const FaultEntry& c = r.faults[2];
  EXPECT_EQ(c.observed_origin, "router");
  EXPECT_EQ(c.reason, "router: no result within 300 s");
  EXPECT_EQ(c.lines_above_debug, 0u);

  EXPECT_EQ(r.faults_misattributed(), 2u);
  EXPECT_EQ(r.faults_not_one_line(), 2u);
  EXPECT_TRUE(r.unexpected_failures.empty());
  EXPECT_EQ(r.problems().size(), 2u);
}

TEST(BuildReport, RejectedFaultIsNotApplied) {
  ReplayResults res;
  RequestOutcome q;
  q.room = 5;
  q.fault = *fault_from_names("decode_fail", "decode/tp0");
  q.decode = failed_result(Role::kDecode, 5, ErrorCode::kResourceExhausted, "decode/tp0");
  q.decode->rejected = true;
  res.requests.push_back(q);
  Report r = build_report(res, LogScan{});
  EXPECT_EQ(r.rejected, 1u);
  EXPECT_TRUE(r.faults.empty());
  ASSERT_EQ(r.faults_not_applied.size(), 1u);
  EXPECT_EQ(r.faults_not_applied[0].outcome, "rejected");
  EXPECT_EQ(r.faults_not_applied[0].code, "resource_exhausted");
  // No log lines at all is itself a problem.
  auto p = r.problems();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "no log lines found");
}

TEST(BuildReport, MismatchAndProcessProblems) {
  ReplayResults res;
  res.requests.push_back(success(1, 1, 2, 100));
  res.requests[0].decode->bytes_mismatched = 3;
  LogScan logs;
  logs.lines = 1;
  Report r = build_report(res, logs);
  r.process_problems.push_back("decode/tp1 exited with code 3 after the shutdown");
  auto p = r.problems();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], "3 mismatched bytes");
  EXPECT_EQ(p[1], "decode/tp1 exited with code 3 after the shutdown");
}

TEST(BuildReport, WrongCodeIsMisattributed) {
  ReplayResults res;
  RequestOutcome q;
  q.room = 4;
  q.fault = *fault_from_names("timeout", "decode/tp1");
  q.prefill = failed_result(Role::kPrefill, 4, ErrorCode::kTransferError, "decode/tp1");
  q.decode = failed_result(Role::kDecode, 4, ErrorCode::kTransferError, "decode/tp1");
  res.requests.push_back(q);
  LogScan logs;
  logs.lines = 1;
  logs.above_debug_by_room = {{"4", 1}};
  Report r = build_report(res, logs);
  ASSERT_EQ(r.faults.size(), 1u);
  EXPECT_EQ(r.faults[0].expected_code, "waiting_timeout");
  EXPECT_EQ(r.faults[0].observed_origin, "decode/tp1");
  EXPECT_FALSE(r.faults[0].attributed());
  EXPECT_EQ(r.faults[0].error, "room 4 failed: transfer_error at decode/tp1: because decode/tp1");
  EXPECT_EQ(r.faults_misattributed(), 1u);
}

LogScan::PeerDead peer_dead(const std::string& by, const std::string& peer, int64_t ns, bool above) {
  return {by, peer, ns, above};
}

TEST(BuildReport, PeerDeathRoomsDetectionsAndLines) {
  const int64_t kill = 50'000'000'000;
  PeerDeathRecord death{"prefill/tp1", kill, 3.5, true, kill + 1'500'000'000};
  ReplayResults res;
  // Failed by the death: both engines name the dead rank.
  RequestOutcome a;
  a.room = 1;
  a.prefill = failed_result(Role::kPrefill, 1, ErrorCode::kPeerUnreachable, "prefill/tp1");
  a.decode = failed_result(Role::kDecode, 1, ErrorCode::kPeerUnreachable, "prefill/tp1");
  a.decode->first_failed_ns = kill + 700'000'000;
  res.requests.push_back(a);
  // A fault whose room the death failed first: not applied.
  RequestOutcome b = a;
  b.room = 2;
  b.fault = *fault_from_names("transfer", "decode/tp0");
  res.requests.push_back(b);
  // Failed around the kill with another origin and no fault: misattributed, unexpected.
  RequestOutcome c;
  c.room = 3;
  c.prefill = failed_result(Role::kPrefill, 3, ErrorCode::kProtocolError, "decode/tp1");
  c.prefill->first_failed_ns = kill + 2'000'000'000;
  c.decode = ok_result(Role::kDecode, 3);
  res.requests.push_back(c);
  // Long after the restart: unexpected but not the death's.
  RequestOutcome d = c;
  d.room = 4;
  d.prefill->first_failed_ns = kill + 60'000'000'000;
  res.requests.push_back(d);
  LogScan logs;
  logs.lines = 10;
  logs.above_debug_by_room = {{"2", 1}};  // a death's room must log nothing above debug
  logs.peer_dead = {peer_dead("decode/tp1", "prefill/tp1", kill + 300'000'000, true),
                    peer_dead("prefill/tp0", "prefill/tp1", kill + 650'000'000, true),
                    peer_dead("prefill/tp0", "prefill/tp1", kill + 600'000'000, false),  // debug
                    peer_dead("decode/tp0", "decode/tp1", kill + 100, true)};  // never killed
  Report r = build_report(res, logs, {death}, 2, 2);
  ASSERT_EQ(r.peer_deaths.size(), 1u);
  const PeerDeathEntry& e = r.peer_deaths[0];
  EXPECT_EQ(e.rooms_failed, 2u);
  EXPECT_EQ(e.rooms_misattributed, 1u);
  ASSERT_EQ(e.misattributed_examples.size(), 1u);
  EXPECT_EQ(e.misattributed_examples[0], "room 3 failed: protocol_error at decode/tp1: because decode/tp1");
  EXPECT_EQ(e.lines_above_debug, 2u);
  EXPECT_EQ(e.expected_engines, (std::vector<std::string>{"decode", "prefill"}));
  ASSERT_EQ(e.detections.size(), 2u);
  EXPECT_EQ(e.detections[0].engine, "decode");
  EXPECT_EQ(e.detections[0].rank, "decode/tp1");
  EXPECT_DOUBLE_EQ(e.detections[0].ms, 300);
  EXPECT_EQ(e.detections[1].engine, "prefill");
  EXPECT_DOUBLE_EQ(e.detections[1].ms, 650);
  ASSERT_EQ(r.faults_not_applied.size(), 1u);
  EXPECT_EQ(r.faults_not_applied[0].outcome, "failed_by_peer_death");
  EXPECT_TRUE(r.faults.empty());
  ASSERT_EQ(r.unexpected_failures.size(), 2u);  // rooms 3 and 4, not 1 and 2
  EXPECT_EQ(r.unexpected_failures[0].room, "3");
  ASSERT_EQ(r.unexplained_peer_dead.size(), 1u);
  EXPECT_EQ(r.unexplained_peer_dead[0], "decode/tp0 declared decode/tp1 dead");
  EXPECT_EQ(e.rooms_with_lines, 1u);
  EXPECT_EQ(e.first_room_with_lines, "2");
  const auto p = r.problems();
  ASSERT_EQ(p.size(), 3u);
  EXPECT_NE(p[0].find("2 unexpected failures"), std::string::npos) << p[0];
  EXPECT_EQ(p[1], "peer death of prefill/tp1: 1 of its rooms logged a line above debug (first: room 2)");
  EXPECT_NE(p[2].find("1 peer_dead lines above debug for a rank that was not killed"), std::string::npos) << p[2];

  // A TP-1 engine has nobody else to notice; the other engine must, exactly once.
  logs.peer_dead = {peer_dead("decode/tp0", "prefill/tp0", kill + 10, true),
                    peer_dead("decode/tp0", "prefill/tp0", kill + 20, true)};
  Report one = build_report(ReplayResults{}, logs, {{"prefill/tp0", kill, 1, false, 0}}, 1, 1);
  EXPECT_EQ(one.peer_deaths[0].expected_engines, (std::vector<std::string>{"decode"}));
  ASSERT_EQ(one.problems().size(), 1u);
  EXPECT_NE(one.problems()[0].find("2 peer_dead lines above debug, expected 1"), std::string::npos);
  logs.peer_dead.clear();
  Report none = build_report(ReplayResults{}, logs, {{"decode/tp1", kill, 1, false, 0}}, 2, 2);
  const auto np = none.problems();
  ASSERT_EQ(np.size(), 3u);
  EXPECT_EQ(np[0], "peer death of decode/tp1: the decode engine logged no peer_dead line above debug");
  EXPECT_EQ(np[1], "peer death of decode/tp1: the prefill engine logged no peer_dead line above debug");

  // A rank the other engine has no data path to (an MLA prefill rank that is no decode rank's
  // source): only its own engine can see it die, once.
  logs.peer_dead = {peer_dead("prefill/tp0", "prefill/tp2", kill + 600'000'000, true)};
  PeerDeathRecord silent{"prefill/tp2", kill, 1, true, kill + 1'500'000'000};
  silent.other_engine_peers = false;
  Report s = build_report(ReplayResults{}, logs, {silent}, 4, 2);
  EXPECT_EQ(s.peer_deaths[0].expected_engines, (std::vector<std::string>{"prefill"}));
  EXPECT_TRUE(s.problems().empty()) << s.problems()[0];
  silent.other_engine_peers = true;  // the same lines for a rank the decode engine talks to
  EXPECT_FALSE(build_report(ReplayResults{}, logs, {silent}, 4, 2).problems().empty());
}

// The prefill compute model: each succeeded request's transfer tail (last layer's compute ->
// decode Success), listed and summarised; requests without a compute end have none.
TEST(BuildReport, TransferTailPerRequestAndPercentiles) {
  ReplayResults res;
  for (uint64_t room = 1; room <= 4; ++room) {
    res.requests.push_back(success(room, 100, 1'000'000 * int64_t(10 + room), 8));
    res.requests.back().prefill->compute_end_ns = 10'000'000;  // tails 1, 2, 3, 4 ms
  }
  res.requests.push_back(success(5, 100, 50'000'000, 8));  // no compute end: no tail
  Report r = build_report(res, LogScan{});
  ASSERT_EQ(r.transfer_tails.size(), 4u);
  EXPECT_EQ(r.transfer_tails[0].room, "1");
  EXPECT_EQ(r.transfer_tails[0].input_tokens, 100u);
  EXPECT_DOUBLE_EQ(r.transfer_tails[0].ms, 1.0);
  EXPECT_EQ(r.transfer_tail_ms.count, 4u);
  EXPECT_DOUBLE_EQ(r.transfer_tail_ms.p50, 2.0);
  EXPECT_DOUBLE_EQ(r.transfer_tail_ms.max, 4.0);
  const auto j = nlohmann::json::parse(report_json(r, res, "{}", 1, ""));
  EXPECT_EQ(j["transfer_tail_ms"]["count"], 4);
  EXPECT_DOUBLE_EQ(j["transfer_tail_ms"]["p99"].get<double>(), 4.0);
  ASSERT_EQ(j["transfer_tails"].size(), 4u);
  EXPECT_EQ(j["transfer_tails"][3]["room"], "4");
  EXPECT_DOUBLE_EQ(j["transfer_tails"][3]["ms"].get<double>(), 4.0);
  EXPECT_NE(summary_text(r, 1).find("transfer tail (last layer's compute -> decode Success) p50 2.0 ms"),
            std::string::npos);
}

TEST(ReportJson, HasEveryDocumentedField) {
  ReplayResults res;
  res.dispatch_start_ns = 1;
  res.last_result_ns = 1'000'000'001;
  res.requests.push_back(success(9, 10, 20, 5));
  RequestOutcome f;
  f.room = 10;
  f.fault = *fault_from_names("transfer", "prefill/tp0");
  f.prefill = failed_result(Role::kPrefill, 10, ErrorCode::kTransferError, "prefill/tp0");
  f.decode = failed_result(Role::kDecode, 10, ErrorCode::kTransferError, "prefill/tp0");
  res.requests.push_back(f);
  res.decode_stats = std::vector<RankLeakStats>{{"decode/tp0", 0, 0, 0, 1}};
  LogScan logs;
  logs.lines = 3;
  logs.files = 2;
  logs.above_debug_by_room = {{"10", 1}};
  Report r = build_report(res, logs);
  const auto j = nlohmann::json::parse(
      report_json(r, res, R"({"trace":"x.csv","seed":3})", 12.5, ""));
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["config"]["seed"], 3);
  EXPECT_EQ(j["requests"]["total"], 2);
  EXPECT_EQ(j["requests"]["succeeded"], 1);
  EXPECT_EQ(j["requests"]["failed"], 1);
  EXPECT_EQ(j["requests"]["rejected"], 0);
  EXPECT_EQ(j["bytes"]["transferred"], 5);
  EXPECT_EQ(j["bytes"]["verified"], 5);
  EXPECT_EQ(j["bytes"]["mismatched"], 0);
  EXPECT_DOUBLE_EQ(j["wall_s"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(j["transfer_latency_ms"]["p50"].get<double>(), 0.0);
  EXPECT_TRUE(j["throughput_gb_per_s"].is_number());
  ASSERT_EQ(j["faults"].size(), 1u);
  EXPECT_EQ(j["faults"][0]["room"], "10");
  EXPECT_EQ(j["faults"][0]["injected_at"], "prefill/tp0");
  EXPECT_EQ(j["faults"][0]["observed_origin"], "prefill/tp0");
  EXPECT_EQ(j["faults"][0]["lines_above_debug"], 1);
  EXPECT_EQ(j["faults"][0]["applied"], true);
  EXPECT_EQ(j["faults"][0]["ranks_total"], 2);
  EXPECT_EQ(j["faults"][0]["ranks_concluded"], 0);
  EXPECT_TRUE(j["faults"][0]["concluded_engines"].empty());
  EXPECT_TRUE(j["faults_not_applied"].is_array());
  EXPECT_EQ(j["faults_summary"]["attributed"], 1);
  EXPECT_EQ(j["faults"][0]["expected_code"], "transfer_error");
  EXPECT_EQ(j["faults"][0]["error"], "room 10 failed: transfer_error at prefill/tp0: because prefill/tp0");
  const auto& kind = j["faults_summary"]["by_kind"]["transfer@prefill"];
  EXPECT_EQ(kind["injected"], 1);
  EXPECT_EQ(kind["applied"], 1);
  EXPECT_EQ(kind["attributed"], 1);
  EXPECT_EQ(kind["exactly_one_line"], 1);
  EXPECT_EQ(kind["rooms_with_a_concluded_engine"], 0);
  EXPECT_EQ(kind["time_to_all_failed_ms"]["count"], 1);
  EXPECT_EQ(j["faults_summary"]["peer_deaths"], 0);
  EXPECT_TRUE(j["peer_deaths"].empty());
  EXPECT_TRUE(j["unexplained_peer_dead"].empty());
  EXPECT_TRUE(j["unexpected_failures"].empty());
  EXPECT_TRUE(j["rejected_requests"].empty());
  EXPECT_EQ(j["transfer_tail_ms"]["count"], 0) << "no compute model";
  EXPECT_TRUE(j["transfer_tails"].empty());
  EXPECT_TRUE(j["leaks"]["prefill"].is_null());
  EXPECT_EQ(j["leaks"]["decode"][0]["rank"], "decode/tp0");
  EXPECT_EQ(j["logs"]["files"], 2);
  EXPECT_TRUE(j["problems"].empty());

  // A peer death entry.
  logs.peer_dead = {peer_dead("prefill/tp0", "decode/tp0", 2'000'000, true)};
  Report pd = build_report(res, logs, {{"decode/tp0", 1'000'000, 4.25, true, 9'000'000}}, 1, 1);
  const auto jd = nlohmann::json::parse(report_json(pd, res, "{}", 1, ""));
  ASSERT_EQ(jd["peer_deaths"].size(), 1u);
  const auto& e = jd["peer_deaths"][0];
  EXPECT_EQ(e["rank"], "decode/tp0");
  EXPECT_DOUBLE_EQ(e["killed_at"].get<double>(), 4.25);
  EXPECT_EQ(e["restarted"], true);
  EXPECT_DOUBLE_EQ(e["restart_after_ms"].get<double>(), 8.0);
  EXPECT_EQ(e["detections"][0]["engine"], "prefill");
  EXPECT_EQ(e["detections"][0]["rank"], "prefill/tp0");
  EXPECT_DOUBLE_EQ(e["detections"][0]["ms"].get<double>(), 1.0);
  EXPECT_EQ(e["lines_above_debug"], 1);
  EXPECT_EQ(e["rooms_failed"], 0);
  EXPECT_EQ(e["rooms_misattributed"], 0);
  EXPECT_EQ(jd["faults_summary"]["peer_deaths"], 1);
  EXPECT_TRUE(jd["problems"].empty()) << jd["problems"].dump();

  const auto partial = nlohmann::json::parse(partial_report_json("{}", 1.0, "decode/tp0 died"));
  EXPECT_EQ(partial["status"], "failed");
  EXPECT_EQ(partial["error"], "decode/tp0 died");
}

// A failure the decode side observes after the prefill engine concluded the room with Success
// (transfer@decode, a late abort) is said so: prefill's ranks are concluded, not silently missing.
// A fault whose engine verdict is missing leaves ranks unaccounted, which is a problem.
TEST(BuildReport, PrefillConcludedBeforeADecodeFailureIsExplicit) {
  ReplayResults res;
  RequestOutcome late = success(90, 1, 2, 10);
  late.fault = *fault_from_names("transfer", "decode/tp1");
  late.decode = failed_result(Role::kDecode, 90, ErrorCode::kTransferError, "decode/tp1");
  late.decode->ranks_failed = 2;
  res.requests.push_back(late);
  LogScan logs;
  logs.lines = 5;
  logs.above_debug_by_room = {{"90", 1}, {"91", 1}};
  Report r = build_report(res, logs, {}, 2, 2);
  ASSERT_EQ(r.faults.size(), 1u);
  EXPECT_EQ(r.faults[0].ranks_failed, 2u);
  EXPECT_EQ(r.faults[0].ranks_concluded, 2u);
  EXPECT_EQ(r.faults[0].ranks_total, 4u);
  EXPECT_EQ(r.faults[0].concluded_engines, std::vector<std::string>{"prefill"});
  EXPECT_TRUE(r.problems().empty()) << r.problems().front();

  RequestOutcome half;  // the prefill engine's verdict never came
  half.room = 91;
  half.fault = *fault_from_names("decode_fail", "decode/tp0");
  half.decode = failed_result(Role::kDecode, 91, ErrorCode::kInjected, "decode/tp0");
  half.decode->ranks_failed = 2;
  res.requests.push_back(half);
  r = build_report(res, logs, {}, 2, 2);
  ASSERT_EQ(r.faults.size(), 2u);
  EXPECT_EQ(r.faults[1].ranks_unaccounted(), 2u);
  // A rank killed while the room was live is lost, not unaccounted.
  RequestOutcome lost;
  lost.room = 92;
  lost.fault = *fault_from_names("decode_fail", "decode/tp1");
  lost.prefill = failed_result(Role::kPrefill, 92, ErrorCode::kInjected, "decode/tp1");
  lost.prefill->ranks_lost = 1;
  lost.decode = failed_result(Role::kDecode, 92, ErrorCode::kInjected, "decode/tp1");
  lost.decode->ranks_failed = 2;
  ReplayResults one;
  one.requests.push_back(lost);
  logs.above_debug_by_room = {{"92", 1}};
  Report rl = build_report(one, logs, {}, 2, 2);
  ASSERT_EQ(rl.faults.size(), 1u);
  EXPECT_EQ(rl.faults[0].ranks_lost, 1u);
  EXPECT_EQ(rl.faults[0].ranks_unaccounted(), 0u);
  EXPECT_TRUE(rl.problems().empty()) << rl.problems().front();
  auto problems = r.problems();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("1 faults left ranks neither Failed nor concluded (first: room 91, 2 of 4"),
            std::string::npos)
      << problems[0];
}

}  // namespace
}  // namespace kvferry::replay

namespace kvferry::replay {
namespace {

// xPyD: prefill origins are named by the room's prefill instance (every prefill instance's ranks
// are engine 0 in the library), decode origins by their own engine id; per-instance figures.
TEST(BuildReport, InstancesNameOriginsAndGetTheirFigures) {
  ReplayResults res;
  res.dispatch_start_ns = 1;
  res.last_result_ns = 1'000'000'001;  // 1 s
  RequestOutcome a = success(1, 10, 2'000'010, 1000);  // p0 -> d1, 2 ms
  a.prefill_instance = 0;
  a.decode_instance = 1;
  a.dispatched_ns = 5;
  RequestOutcome b = success(2, 10, 4'000'010, 3000);  // p1 -> d0, 4 ms
  b.prefill_instance = 1;
  b.dispatched_ns = 5;
  // A prefill fault in prefill instance 1: the engines say "prefill/tp0", the report names it
  // "prefill1/tp0", as the injected rank.
  RequestOutcome f;
  f.room = 3;
  f.dispatched_ns = 5;
  f.prefill_instance = 1;
  f.decode_instance = 1;
  f.fault = *fault_from_names("transfer", "prefill/tp0");
  f.prefill = failed_result(Role::kPrefill, 3, ErrorCode::kTransferError, "prefill/tp0");
  f.decode = failed_result(Role::kDecode, 3, ErrorCode::kTransferError, "prefill/tp0");
  // A decode fault whose origin is another decode instance than the room's: misattributed.
  RequestOutcome g;
  g.room = 4;
  g.dispatched_ns = 5;
  g.decode_instance = 1;
  g.fault = *fault_from_names("decode_fail", "decode1/tp0");
  g.prefill = failed_result(Role::kPrefill, 4, ErrorCode::kInjected, "decode1/tp0");
  g.decode = failed_result(Role::kDecode, 4, ErrorCode::kInjected, "decode2/tp0");
  for (auto* q : {&a, &b, &f, &g}) res.requests.push_back(*q);
  EXPECT_EQ(instance_origin("prefill/tp0", f), "prefill1/tp0");
  EXPECT_EQ(instance_origin("decode1/tp0", f), "decode1/tp0");
  EXPECT_EQ(instance_origin("prefill/tp0", a), "prefill/tp0");
  EXPECT_EQ(instance_origin("router", f), "router");

  Report rep = build_report(res, LogScan{});
  ASSERT_EQ(rep.faults.size(), 2u);
  EXPECT_EQ(rep.faults[0].injected_at, "prefill1/tp0");
  EXPECT_EQ(rep.faults[0].observed_origin, "prefill1/tp0");
  EXPECT_TRUE(rep.faults[0].attributed());
  EXPECT_EQ(rep.faults[1].observed_origin, "prefill says decode1/tp0, decode says decode2/tp0");
  EXPECT_FALSE(rep.faults[1].attributed());
  EXPECT_TRUE(rep.instances.empty()) << "figures only when asked for";

  add_instance_figures(rep, res, 2, 2);
  ASSERT_EQ(rep.instances.size(), 4u);
  const InstanceFigures& p1 = rep.instances[1];
  EXPECT_EQ(p1.name(), "prefill instance 1");
  EXPECT_EQ(p1.rooms, 2u);
  EXPECT_EQ(p1.succeeded, 1u);
  EXPECT_EQ(p1.failed, 1u);
  EXPECT_EQ(p1.bytes, 3000u);
  EXPECT_EQ(p1.faults, 1u);
  EXPECT_EQ(p1.faults_attributed, 1u);
  EXPECT_EQ(p1.rooms_by_peer_instance, (std::vector<uint64_t>{1, 1}));
  const InstanceFigures& d1 = rep.instances[3];
  EXPECT_EQ(d1.role, Role::kDecode);
  EXPECT_EQ(d1.rooms, 3u);
  EXPECT_EQ(d1.faults, 1u);
  EXPECT_EQ(d1.faults_attributed, 0u);
  EXPECT_EQ(d1.transfer_latency_ms.count, 1u);
  EXPECT_DOUBLE_EQ(d1.transfer_latency_ms.p50, 2.0);
  EXPECT_EQ(d1.rooms_by_peer_instance, (std::vector<uint64_t>{2, 1}));
  EXPECT_NEAR(rep.instances[0].gb_per_s, 1000 / 1e9, 1e-12);
  const auto j = nlohmann::json::parse(report_json(rep, res, "{}", 1.0, ""));
  ASSERT_EQ(j["instances"].size(), 4u);
  EXPECT_EQ(j["instances"][3]["role"], "decode");
  EXPECT_EQ(j["instances"][3]["rooms"], 3);
  EXPECT_NE(summary_text(rep, 1.0).find("decode instance 1: 3 rooms, 1 ok, 2 failed"), std::string::npos)
      << summary_text(rep, 1.0);
  add_instance_figures(rep, res, 1, 1);
  EXPECT_TRUE(rep.instances.empty());
  EXPECT_FALSE(nlohmann::json::parse(report_json(rep, res, "{}", 1.0, "")).contains("instances"));
}

}  // namespace
}  // namespace kvferry::replay
