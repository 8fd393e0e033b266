// --scale in results.json and the report (results.h ScaleRecord, report.h add_scale_events()).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "replay/report.h"
#include "replay/results.h"

namespace kvferry::replay {
namespace {

constexpr int64_t kMs = 1'000'000;

ReplayResults two_events() {
  ReplayResults r;
  ScaleRecord join;
  join.t_s = 2;
  join.join = true;
  join.role = Role::kPrefill;
  join.instance = 1;
  join.event_ns = 2000 * kMs;
  join.ready_ns = 2300 * kMs;
  join.first_room_ns = 2400 * kMs;
  join.rooms = 7;
  ScaleRecord leave;
  leave.t_s = 4;
  leave.role = Role::kDecode;
  leave.instance = 1;
  leave.event_ns = 4000 * kMs;
  leave.in_flight_at_event = 2;
  leave.leave_sent_ns = 4100 * kMs;
  leave.left_ns = 4250 * kMs;
  r.scale = {join, leave};
  return r;
}

TEST(ResultsScale, RoundTripsAndRejectsBadEntries) {
  const ReplayResults r = two_events();
  auto back = decode_results(encode_results(r));
  ASSERT_TRUE(back.ok()) << back.status().str();
  ASSERT_EQ(back->scale.size(), 2u);
  EXPECT_TRUE(back->scale[0].join);
  EXPECT_EQ(back->scale[0].first_room_ns, 2400 * kMs);
  EXPECT_EQ(back->scale[1].role, Role::kDecode);
  EXPECT_EQ(back->scale[1].left_ns, 4250 * kMs);
  EXPECT_EQ(back->scale[1].in_flight_at_event, 2u);
  // Without --scale there is no "scale" key, and a file without one decodes to none.
  EXPECT_EQ(encode_results(ReplayResults{}).find("\"scale\""), std::string::npos);
  auto j = nlohmann::json::parse(encode_results(r));
  j["scale"][0]["role"] = "router";
  EXPECT_FALSE(decode_results(j.dump()).ok());
  j = nlohmann::json::parse(encode_results(r));
  j["scale"][1].erase("left_ns");
  EXPECT_FALSE(decode_results(j.dump()).ok());
  j = nlohmann::json::parse(encode_results(r));
  j["scale"] = "x";
  EXPECT_FALSE(decode_results(j.dump()).ok());
}

TEST(ReportScale, FiguresFromTheStartOfTheInstanceAndTheEvent) {
  Report rep;
  add_scale_events(rep, two_events(), {{{Role::kPrefill, 1u}, 2100 * kMs}});
  ASSERT_EQ(rep.scale_events.size(), 2u);
  EXPECT_DOUBLE_EQ(rep.scale_events[0].ready_ms, 200);
  EXPECT_DOUBLE_EQ(rep.scale_events[0].first_room_ms, 300);
  EXPECT_DOUBLE_EQ(rep.scale_events[1].drained_ms, 250);
  std::vector<std::string> p;
  scale_problems(rep, p);
  EXPECT_TRUE(p.empty());
  const auto j = nlohmann::json::parse(scale_events_json(rep));
  EXPECT_EQ(j[0]["action"], "join");
  EXPECT_TRUE(j[0]["drained_ms"].is_null());
  EXPECT_TRUE(j[0]["in_flight_at_event"].is_null());
  EXPECT_EQ(j[1]["action"], "leave");
  EXPECT_EQ(j[1]["in_flight_at_event"], 2);
  EXPECT_EQ(j[1]["drained_ms"], 250.0);
  EXPECT_NE(scale_events_text(rep).find("t=4s -decode instance 1"), std::string::npos);
}

TEST(ReportScale, ProblemsForFailuresRoomsAfterTheEventAndPeerDeaths) {
  ReplayResults r = two_events();
  r.scale[0].ready_ns = 0;            // never ready
  r.scale[1].rooms = 1;               // a room after its event
  r.scale[1].failed_rooms_caused = 2;
  Report rep;
  LogScan::PeerDead before{"prefill/tp0", "decode1/tp0", 3000 * kMs, true, ""};
  LogScan::PeerDead after{"prefill/tp0", "decode1/tp1", 4500 * kMs, true, ""};
  LogScan::PeerDead other{"prefill/tp0", "decode/tp1", 4500 * kMs, true, ""};
  LogScan::PeerDead quiet{"prefill/tp0", "decode1/tp1", 4500 * kMs, false, ""};
  rep.logs.peer_dead = {before, after, other, quiet};
  add_scale_events(rep, r, {});
  EXPECT_EQ(rep.scale_events[1].peer_dead_lines, 1u);
  std::vector<std::string> p;
  scale_problems(rep, p);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_NE(p[0].find("never ready"), std::string::npos);
  EXPECT_NE(p[1].find("1 requests dispatched to it after its event"), std::string::npos);
  EXPECT_NE(p[2].find("2 failed rooms caused"), std::string::npos);
  EXPECT_NE(p[3].find("peer_dead"), std::string::npos);
  EXPECT_EQ(rep.problems().size() >= 4, true);
}

}  // namespace
}  // namespace kvferry::replay
