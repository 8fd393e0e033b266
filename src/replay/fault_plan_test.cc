#include "replay/fault_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace kvferry::replay {
namespace {

std::string error_of(const std::string& spec, uint32_t prefill_tp = 2, uint32_t decode_tp = 2) {
  auto p = parse_fault_plan(spec, prefill_tp, decode_tp);
  EXPECT_FALSE(p.ok()) << spec;
  return p.ok() ? "" : p.status().message();
}

TEST(FaultPlan, ParsesTheDocumentedExample) {
  auto p = parse_fault_plan(
      "transfer@prefill:0.02,transfer@decode:0.01, abort:0.01,peer_death@prefill/tp1:once,"
      "timeout@decode:0.01",
      2, 2);
  ASSERT_TRUE(p.ok()) << p.status().str();
  ASSERT_EQ(p->items.size(), 5u);
  EXPECT_EQ(p->items[0].kind, "transfer");
  EXPECT_EQ(p->items[0].place, "prefill");
  EXPECT_DOUBLE_EQ(p->items[0].rate, 0.02);
  EXPECT_EQ(p->items[2].kind, "abort");
  EXPECT_EQ(p->items[2].place, "");
  EXPECT_TRUE(p->items[3].once);
  EXPECT_EQ(p->items[3].place, "prefill/tp1");
  EXPECT_TRUE(p->has_peer_death());
  EXPECT_NEAR(p->total_rate(), 0.05, 1e-12);
  EXPECT_EQ(p->str(),
            "transfer@prefill:0.02,transfer@decode:0.01,abort:0.01,peer_death@prefill/tp1:once,"
            "timeout@decode:0.01");
  auto again = parse_fault_plan(p->str(), 2, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->str(), p->str());
  EXPECT_TRUE(parse_fault_plan("", 1, 1)->empty());
  EXPECT_EQ(parse_fault_plan("abort@decode/tp0:1", 1, 1)->items[0].place, "");
}

TEST(FaultPlan, BadSpecsNameTheItem) {
  EXPECT_NE(error_of("transfer:0.1,explode:0.1").find("'explode:0.1'"), std::string::npos);
  EXPECT_NE(error_of("transfer:0.1,explode:0.1").find("unknown kind"), std::string::npos);
  EXPECT_NE(error_of("transfer@prefill").find("'transfer@prefill'"), std::string::npos);
  EXPECT_NE(error_of("transfer@prefill:lots").find("'lots'"), std::string::npos);
  EXPECT_NE(error_of("transfer:1.5").find("[0, 1]"), std::string::npos);
  EXPECT_NE(error_of("transfer:-0.1").find("[0, 1]"), std::string::npos);
  EXPECT_NE(error_of("timeout@decode/tp2:0.1").find("decode/tp2 does not exist"), std::string::npos);
  EXPECT_NE(error_of("timeout@gpu7:0.1").find("place 'gpu7'"), std::string::npos);
  EXPECT_NE(error_of("decode_fail@prefill/tp0:0.1").find("decode ranks only"), std::string::npos);
  EXPECT_NE(error_of("prefill_fail@decode/tp0:0.1").find("prefill ranks only"), std::string::npos);
  EXPECT_NE(error_of("prefill_fail@decode:0.1").find("prefill ranks only"), std::string::npos);
  EXPECT_NE(error_of("abort@prefill/tp0:0.1").find("decode leader"), std::string::npos);
  EXPECT_NE(error_of("abort@decode/tp1:0.1").find("decode leader"), std::string::npos);
  EXPECT_NE(error_of("peer_death@decode/tp1:0.5").find("'once'"), std::string::npos);
  EXPECT_NE(error_of("transfer@:0.1").find("empty place"), std::string::npos);
  EXPECT_NE(error_of("transfer:0.1,,abort:0.1").find("empty item"), std::string::npos);
  EXPECT_NE(error_of("transfer:0.6,abort:0.5").find("add up to 1.1"), std::string::npos);
}

TEST(FaultPlan, FaultRateShorthand) {
  EXPECT_TRUE(fault_rate_plan(0).empty());
  EXPECT_EQ(fault_rate_plan(0.2).str(), "transfer@prefill:0.1,decode_fail@decode:0.1");
}

TEST(FaultPlan, ExpectedCodePerKindAndSide) {
  EXPECT_EQ(expected_code(*fault_from_names("transfer", "prefill/tp1")), "transfer_error");
  EXPECT_EQ(expected_code(*fault_from_names("transfer", "decode/tp0")), "transfer_error");
  EXPECT_EQ(expected_code(*fault_from_names("decode_fail", "decode/tp1")), "injected");
  EXPECT_EQ(expected_code(*fault_from_names("timeout", "prefill/tp0")), "bootstrap_timeout");
  EXPECT_EQ(expected_code(*fault_from_names("timeout", "decode/tp1")), "waiting_timeout");
  EXPECT_EQ(expected_code(*fault_from_names("abort", "decode/tp0")), "aborted");
  EXPECT_EQ(expected_code(*fault_from_names("prefill_fail", "prefill/tp3")), "injected");
  EXPECT_EQ(expected_code(*fault_from_names("corrupt", "decode/tp1")), "integrity_error");
}

// corrupt: named for the decode rank that detects it (where the failure's origin is).
TEST(AssignRoomFaults, CorruptActsOnDecodeRanksOnly) {
  std::set<std::string> at;
  for (const auto& f : assign_room_faults(*parse_fault_plan("corrupt:1", 2, 2), 200, 5, 2, 2)) {
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->kind, FaultKind::kCorrupt);
    at.insert(f->at.str());
  }
  EXPECT_EQ(at, (std::set<std::string>{"decode/tp0", "decode/tp1"}));
  EXPECT_EQ(parse_fault_plan("corrupt@decode/tp1:0.5", 2, 2)->str(), "corrupt@decode/tp1:0.5");
  for (const char* bad : {"corrupt@prefill:0.1", "corrupt@prefill/tp0:once"}) {
    auto p = parse_fault_plan(bad, 2, 2);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_NE(p.status().message().find("corrupt names the decode rank"), std::string::npos) << p.status().str();
  }
}

TEST(AssignRoomFaults, PrefillFailWithoutPlaceActsOnPrefillRanksOnly) {
  std::set<std::string> at;
  for (const auto& f : assign_room_faults(*parse_fault_plan("prefill_fail:1", 4, 2), 300, 5, 4, 2)) {
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->kind, FaultKind::kPrefillFail);
    at.insert(f->at.str());
  }
  EXPECT_EQ(at, (std::set<std::string>{"prefill/tp0", "prefill/tp1", "prefill/tp2", "prefill/tp3"}));
}

// DP groups: a room's fault names none (the router places it); a peer death may name one.
TEST(FaultPlan, DataParallelPlaces) {
  auto p = parse_fault_plan("peer_death@decode/tp1/dp2:once", 2, 2, 1, 3);
  ASSERT_TRUE(p.ok()) << p.status().str();
  EXPECT_EQ(p->items[0].place, "decode/tp1/dp2");
  auto q = parse_fault_plan("peer_death@decode/tp1/dp3:once", 2, 2, 1, 3);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("DP 3"), std::string::npos) << q.status().message();
  auto r = parse_fault_plan("transfer@prefill/tp0/dp1:0.1", 2, 2, 2, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("only peer_death names a DP group"), std::string::npos);
}

TEST(AssignRoomFaults, RateOneOfOneKindAtARoleCoversItsRanks) {
  auto plan = *parse_fault_plan("timeout@decode:1", 2, 3);
  auto a = assign_room_faults(plan, 300, 5, 2, 3);
  std::set<std::string> at;
  for (const auto& f : a) {
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->kind, FaultKind::kTimeout);
    at.insert(f->at.str());
  }
  EXPECT_EQ(at, (std::set<std::string>{"decode/tp0", "decode/tp1", "decode/tp2"}));
  for (const auto& f : assign_room_faults(*parse_fault_plan("abort:1", 2, 2), 50, 5, 2, 2)) {
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->at.str(), "decode/tp0");
  }
  std::set<std::string> any;
  for (const auto& f : assign_room_faults(*parse_fault_plan("transfer:1", 2, 2), 300, 5, 2, 2)) {
    any.insert(f->at.str());
  }
  EXPECT_EQ(any.size(), 4u);  // no place: any rank of either engine
}

TEST(AssignRoomFaults, DeterministicMixAtMostOnePerRequest) {
  auto plan = *parse_fault_plan("transfer@prefill:0.1,decode_fail:0.1,abort:0.2", 2, 2);
  auto a = assign_room_faults(plan, 4000, 11, 2, 2);
  auto b = assign_room_faults(plan, 4000, 11, 2, 2);
  auto c = assign_room_faults(plan, 4000, 12, 2, 2);
  std::map<std::string, size_t> kinds;
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].has_value(), b[i].has_value());
    if (a[i]) {
      EXPECT_EQ(a[i]->at, b[i]->at);
      ++kinds[std::string(fault_kind_name(a[i]->kind))];
    }
    differ += a[i].has_value() != c[i].has_value();
  }
  EXPECT_GT(differ, 0u);
  // Expected 400, 400, 800 of 4000; margins over 5 sigma.
  EXPECT_NEAR(double(kinds["transfer"]), 400, 100);
  EXPECT_NEAR(double(kinds["decode_fail"]), 400, 100);
  EXPECT_NEAR(double(kinds["abort"]), 800, 130);
}

TEST(AssignRoomFaults, OnceIsExactlyOneRequest) {
  auto plan = *parse_fault_plan("transfer@prefill/tp1:once,decode_fail@decode/tp0:once,abort:0", 2, 2);
  auto a = assign_room_faults(plan, 7, 3, 2, 2);
  std::map<std::string, size_t> seen;
  for (const auto& f : a) {
    if (f) ++seen[f->str()];
  }
  EXPECT_EQ(seen, (std::map<std::string, size_t>{{"transfer@prefill/tp1", 1}, {"decode_fail@decode/tp0", 1}}));
  EXPECT_EQ(assign_room_faults(plan, 1, 3, 2, 2).size(), 1u);  // more once items than requests
}

TEST(PeerDeaths, SeededThresholdBetween30And60Percent) {
  auto plan = *parse_fault_plan("peer_death@prefill:once,peer_death@decode/tp1:once", 2, 2);
  std::set<std::string> ranks;
  for (uint64_t seed = 1; seed < 40; ++seed) {
    auto d = plan_peer_deaths(plan, 200, seed, 2, 2);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_LE(d[0].after_dispatched, d[1].after_dispatched);
    for (const auto& x : d) {
      EXPECT_GE(x.after_dispatched, 60u);
      EXPECT_LE(x.after_dispatched, 120u);
      ranks.insert(x.rank);
    }
    auto again = plan_peer_deaths(plan, 200, seed, 2, 2);
    EXPECT_EQ(again[0].after_dispatched, d[0].after_dispatched);
    EXPECT_EQ(again[0].rank, d[0].rank);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"prefill/tp0", "prefill/tp1", "decode/tp1"}));
  auto two = plan_peer_deaths(*parse_fault_plan("peer_death:once", 1, 1), 2, 1, 1, 1);
  ASSERT_EQ(two.size(), 1u);
  EXPECT_EQ(two[0].after_dispatched, 1u);  // at least one dispatched, one left
}

TEST(Aborts, DelayIsSeededAndBounded) {
  EXPECT_EQ(abort_delay_ms(1, 77), abort_delay_ms(1, 77));
  std::set<double> seen;
  for (uint64_t room = 1; room < 500; ++room) {
    const double d = abort_delay_ms(9, room);
    EXPECT_GE(d, 2.0);
    EXPECT_LT(d, 10.0);
    seen.insert(d);
  }
  EXPECT_GT(seen.size(), 400u);
}

}  // namespace
}  // namespace kvferry::replay

namespace kvferry::replay {
namespace {

TEST(FaultPlan, RestartAndNetworkFaultsMixWithRoomFaults) {
  auto p = parse_fault_plan("transfer@prefill:0.1,restart@decode/tp1,link_down@h2:300,partition@h1:1500,"
                            "restart@prefill/tp0:once",
                            2, 2);
  ASSERT_TRUE(p.ok()) << p.status().str();
  ASSERT_EQ(p->items.size(), 5u);
  EXPECT_EQ(p->items[1].kind, "restart");
  EXPECT_EQ(p->items[1].place, "decode/tp1");
  EXPECT_TRUE(p->items[1].once);
  EXPECT_TRUE(p->items[2].is_net());
  EXPECT_EQ(p->items[2].place, "h2");
  EXPECT_EQ(p->items[2].ms, 300);
  EXPECT_EQ(p->items[3].kind, "partition");
  EXPECT_EQ(p->items[3].ms, 1500);
  EXPECT_TRUE(p->has_peer_death());
  EXPECT_TRUE(p->has_net_faults());
  EXPECT_NEAR(p->total_rate(), 0.1, 1e-12);  // net faults and restarts take no rate
  EXPECT_EQ(p->str(), "transfer@prefill:0.1,restart@decode/tp1:once,link_down@h2:300,partition@h1:1500,"
                      "restart@prefill/tp0:once");
  EXPECT_EQ(parse_fault_plan(p->str(), 2, 2)->str(), p->str());
  EXPECT_EQ(same_port_restarts(*p), (std::vector<std::string>{"decode/tp1", "prefill/tp0"}));
  // Restarts go with the kills; no request gets a net fault or a restart as its room fault.
  auto deaths = plan_peer_deaths(*p, 100, 7, 2, 2);
  ASSERT_EQ(deaths.size(), 2u);
  for (const auto& d : deaths) EXPECT_TRUE(d.same_ports);
  for (const auto& f : assign_room_faults(*p, 100, 7, 2, 2))
    if (f) {
      EXPECT_EQ(f->kind, FaultKind::kTransfer);
    }
}

TEST(FaultPlan, BadRestartAndNetworkItems) {
  EXPECT_NE(error_of("restart@decode").find("names one rank"), std::string::npos);
  EXPECT_NE(error_of("restart:once").find("names one rank"), std::string::npos);
  EXPECT_NE(error_of("restart@decode/tp1:0.5").find("takes 'once'"), std::string::npos);
  EXPECT_NE(error_of("restart@decode/tp5").find("does not exist"), std::string::npos);
  EXPECT_NE(error_of("link_down:100").find("needs a host"), std::string::npos);
  EXPECT_NE(error_of("partition@h1:0").find("duration in ms"), std::string::npos);
  EXPECT_NE(error_of("partition@h1:once").find("duration in ms"), std::string::npos);
  EXPECT_NE(error_of("link_down@h1:600001").find("duration in ms"), std::string::npos);
  EXPECT_NE(error_of("link_down@h1").find("expected"), std::string::npos);
}

// pause@RANK:MS: one existing rank, a duration; planned like a network fault, no host needed.
TEST(FaultPlan, PauseNamesOneRankAndADuration) {
  auto p = parse_fault_plan("transfer@decode:0.1,pause@prefill/tp1:4000", 2, 2);
  ASSERT_TRUE(p.ok()) << p.status().str();
  ASSERT_EQ(p->items.size(), 2u);
  EXPECT_EQ(p->items[1].kind, "pause");
  EXPECT_EQ(p->items[1].place, "prefill/tp1");
  EXPECT_EQ(p->items[1].ms, 4000);
  EXPECT_TRUE(p->has_pauses());
  EXPECT_FALSE(p->has_net_faults());
  EXPECT_DOUBLE_EQ(p->total_rate(), 0.1);
  EXPECT_EQ(p->str(), "transfer@decode:0.1,pause@prefill/tp1:4000");
  auto planned = plan_net_faults(*p, 100, 7);
  ASSERT_EQ(planned.size(), 1u);
  EXPECT_EQ(planned[0].kind, "pause");
  EXPECT_EQ(planned[0].host, "prefill/tp1");
  EXPECT_GE(planned[0].after_dispatched, 30u);
  EXPECT_LE(planned[0].after_dispatched, 60u);
  EXPECT_TRUE(assign_room_faults(*parse_fault_plan("pause@decode/tp0:100", 1, 1), 10, 1, 1, 1) ==
              std::vector<std::optional<FaultSpec>>(10));  // not a room's fault
  EXPECT_NE(error_of("pause:100").find("needs a rank"), std::string::npos);
  EXPECT_NE(error_of("pause@decode:100").find("names one rank"), std::string::npos);
  EXPECT_NE(error_of("pause@decode/tp5:100").find("does not exist"), std::string::npos);
  EXPECT_NE(error_of("pause@decode/tp1:once").find("duration in ms"), std::string::npos);
}

TEST(NetFaults, SeededThresholdBetween30And60Percent) {
  auto p = parse_fault_plan("partition@h1:1000,link_down@h2:200", 1, 1);
  ASSERT_TRUE(p.ok());
  for (uint64_t seed = 0; seed < 50; ++seed) {
    auto faults = plan_net_faults(*p, 200, seed);
    ASSERT_EQ(faults.size(), 2u);
    EXPECT_LE(faults[0].after_dispatched, faults[1].after_dispatched);  // ordered
    for (const auto& f : faults) {
      EXPECT_GE(f.after_dispatched, 60u);
      EXPECT_LE(f.after_dispatched, 120u);
      EXPECT_TRUE(f.host == "h1" ? f.kind == "partition" && f.ms == 1000 : f.kind == "link_down" && f.ms == 200);
    }
    EXPECT_EQ(plan_net_faults(*p, 200, seed)[0].after_dispatched, faults[0].after_dispatched);  // seeded
  }
  EXPECT_EQ(plan_net_faults(*p, 2, 1)[0].after_dispatched, 1u);
}

}  // namespace
}  // namespace kvferry::replay
