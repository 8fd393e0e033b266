#include "logs/root_cause.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace kvferry::logs {
namespace {

// One JSON log line as the ranks write it (include/kvferry/log.h).
std::string line(const std::string& ts, const std::string& rank, const std::string& level, const std::string& msg,
                 const std::string& extra = "") {
  return "{\"ts\":\"2026-11-30T10:00:" + ts + "Z\",\"level\":\"" + level + "\",\"rank\":\"" + rank +
         "\",\"component\":\"c\",\"msg\":\"" + msg + "\"" + (extra.empty() ? "" : "," + extra) + "}\n";
}

std::string fail_fields(const std::string& room, const std::string& via = "") {
  return "\"room\":\"" + room + "\",\"code\":\"injected\",\"origin\":\"decode/tp1\",\"reason\":\"boom\"" +
         (via.empty() ? "" : ",\"via\":\"" + via + "\"");
}

// Room 7 fails on decode/tp1 (injected). prefill/tp1 learns by a status message from decode/tp1
// (via), prefill/tp0 from prefill/tp1's report (its line names no via), decode/tp0 through the
// decode engine's agreement (via decode/tp1). The prefill host's clock is 400 ms behind, so by
// wall clock alone the prefill ranks would come first.
LogSet skewed() {
  LogSet set;
  parse_log_text(line("00.090000", "prefill/tp1", "debug", "sender created", "\"room\":\"7\"") +
                     line("00.100000", "prefill/tp1", "debug", "room failed: injected at decode/tp1: boom",
                          fail_fields("7", "decode/tp1")) +
                     line("00.120000", "prefill/tp1", "debug", "room 7 failed: injected at decode/tp1: boom",
                          fail_fields("7") + ",\"is_from_another_rank\":\"true\""),
                 "prefill-tp1.jsonl", set);
  parse_log_text(line("00.105000", "prefill/tp0", "debug", "room failed: injected at decode/tp1: boom",
                      fail_fields("7")) +
                     line("00.110000", "prefill/tp0", "debug", "room 7 failed: injected at decode/tp1: boom",
                          fail_fields("7") + ",\"is_from_another_rank\":\"true\""),
                 "prefill-tp0.jsonl", set);
  parse_log_text(line("00.499000", "decode/tp1", "debug", "receiver created", "\"room\":\"7\"") +
                     line("00.500000", "decode/tp1", "debug", "room failed: injected at decode/tp1: boom",
                          fail_fields("7")) +
                     line("00.530000", "decode/tp1", "error", "room 7 failed: injected at decode/tp1: boom",
                          fail_fields("7") + ",\"is_from_another_rank\":\"false\""),
                 "decode-tp1.jsonl", set);
  parse_log_text(line("00.501000", "decode/tp0", "debug", "room failed: injected at decode/tp1: boom",
                      fail_fields("7", "decode/tp1")) +
                     line("00.531000", "decode/tp0", "debug", "room 7 failed: injected at decode/tp1: boom",
                          fail_fields("7") + ",\"is_from_another_rank\":\"true\"") +
                     line("00.600000", "decode/tp0", "debug", "room released", "\"room\":\"8\"") +
                     "not json\n",
                 "decode-tp0.jsonl", set);
  return set;
}

TEST(ParseTs, MicrosecondsSinceEpoch) {
  EXPECT_EQ(parse_ts_us("1970-01-01T00:00:01.5Z"), 1'500'000);
  EXPECT_EQ(parse_ts_us("2026-11-30T10:00:00.000001Z"), parse_ts_us("2026-11-30T10:00:00Z").value() + 1);
  EXPECT_FALSE(parse_ts_us("2026-11-30 10:00:00Z"));
  EXPECT_FALSE(parse_ts_us("2026-11-30T10:00:00"));
  EXPECT_FALSE(parse_ts_us(""));
}

TEST(LogSet, CountsInvalidLinesAndKeepsFields) {
  LogSet set = skewed();
  EXPECT_EQ(set.invalid_lines, 1u);
  EXPECT_EQ(set.first_invalid, "decode-tp0.jsonl:4");
  ASSERT_EQ(set.lines.size(), 11u);
  EXPECT_EQ(set.lines[1].via, "decode/tp1");
  EXPECT_EQ(set.lines[1].room, 7u);
  EXPECT_EQ(set.lines[2].is_from_another_rank, true);
}

TEST(RootCause, OriginFirstDespiteClockSkew) {
  LogSet set = skewed();
  auto rooms = failed_rooms(set);
  ASSERT_EQ(rooms.size(), 1u);  // room 8 did not fail
  const FailedRoom& f = rooms[0];
  EXPECT_EQ(f.room, 7u);
  EXPECT_EQ(f.origin, "decode/tp1");
  EXPECT_EQ(f.code, "injected");
  EXPECT_EQ(f.reason, "boom");
  EXPECT_EQ(f.time, "2026-11-30T10:00:00.500000Z");
  EXPECT_EQ(f.logged_by, "decode/tp1");
  // Causal: decode/tp1 (origin), then prefill/tp1 (told by decode/tp1), then prefill/tp0 (its ts
  // .105 is earliest among the rest once the origin is placed), then decode/tp0.
  ASSERT_EQ(f.ranks.size(), 4u);
  EXPECT_EQ(f.ranks[0].rank, "decode/tp1");
  EXPECT_EQ(f.ranks[0].how, "root cause");
  EXPECT_EQ(f.ranks[0].level, "error");
  EXPECT_EQ(f.ranks[1].rank, "prefill/tp1");
  EXPECT_EQ(f.ranks[1].how, "status from decode/tp1");
  EXPECT_EQ(f.ranks[2].rank, "prefill/tp0");
  EXPECT_EQ(f.ranks[2].how, "propagated");
  EXPECT_EQ(f.ranks[3].rank, "decode/tp0");
  EXPECT_EQ(f.ranks[3].how, "engine agreement from decode/tp1");
  // The timeline keeps each file's order; lines without a cause to wait for go by ts.
  ASSERT_EQ(f.timeline.size(), 10u);
  EXPECT_EQ(f.timeline[0]->msg, "sender created");  // no causal constraint: earliest ts
  EXPECT_EQ(f.timeline[1]->rank, "decode/tp1");     // receiver created (.499) before...
  EXPECT_EQ(f.timeline[2]->rank, "decode/tp1");     // ...the root cause (.500)
  EXPECT_EQ(f.timeline[2]->msg, "room failed: injected at decode/tp1: boom");
  EXPECT_EQ(f.timeline[3]->rank, "prefill/tp1");    // learned (.100 by its clock) after the origin
}

TEST(RootCause, WallClockAloneWouldPutAPropagatedRankFirst) {
  // The same logs without the causal constraint (a room nobody failed is merged by ts only):
  // proves the skew in `skewed()` is real, so the test above can fail.
  LogSet set = skewed();
  for (LogLine& l : set.lines) l.code.clear();
  auto t = room_timeline(set, 7);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t[1]->rank, "prefill/tp1");
  EXPECT_EQ(t[1]->ts, "2026-11-30T10:00:00.100000Z");
}

TEST(RootCause, DeadOriginUsesItsDetector) {
  LogSet set;
  parse_log_text(line("01.000000", "decode/tp0", "error", "prefill/tp1 stopped answering",
                      "\"code\":\"peer_unreachable\",\"origin\":\"prefill/tp1\",\"event\":\"peer_dead\","
                      "\"peer\":\"prefill/tp1\"") +
                     line("01.001000", "decode/tp0", "debug", "room failed: peer_unreachable at prefill/tp1: gone",
                          "\"room\":\"9\",\"code\":\"peer_unreachable\",\"origin\":\"prefill/tp1\",\"reason\":\"gone\""),
                 "decode-tp0.jsonl", set);
  auto rooms = failed_rooms(set, 9);
  ASSERT_EQ(rooms.size(), 1u);
  EXPECT_EQ(rooms[0].origin, "prefill/tp1");
  EXPECT_EQ(rooms[0].logged_by, "decode/tp0");
  EXPECT_EQ(rooms[0].time, "2026-11-30T10:00:01.000000Z");
  EXPECT_EQ(rooms[0].reason, "gone");
  EXPECT_TRUE(failed_rooms(set, 10).empty());
}

TEST(RootCause, ReasonIsReadFromTheField) {
  // The msg's prose is not parsed: a line whose msg says something else still gives the field.
  LogSet set;
  parse_log_text(line("01.000000", "decode/tp0", "error", "room 5 failed (see fields)",
                      "\"room\":\"5\",\"code\":\"injected\",\"origin\":\"decode/tp0\",\"reason\":\"x: y at z: w\""),
                 "decode-tp0.jsonl", set);
  auto rooms = failed_rooms(set);
  ASSERT_EQ(rooms.size(), 1u);
  EXPECT_EQ(rooms[0].reason, "x: y at z: w");
}

TEST(RootCause, SupersededRanksAreDetailNotASecondOrigin) {
  // Both decode ranks timed out; decode/tp0 won the rule, decode/tp1's own failure lost.
  LogSet set;
  const std::string win = "\"room\":\"3\",\"code\":\"waiting_timeout\",\"origin\":\"decode/tp0\",\"reason\":\"r0\"";
  parse_log_text(line("01.000000", "decode/tp0", "debug", "room failed", win) +
                     line("01.010000", "decode/tp0", "error", "room 3 failed", win + ",\"is_from_another_rank\":\"false\""),
                 "decode-tp0.jsonl", set);
  parse_log_text(line("01.000100", "decode/tp1", "debug", "room failed",
                      "\"room\":\"3\",\"code\":\"waiting_timeout\",\"origin\":\"decode/tp1\",\"reason\":\"r1\"") +
                     line("01.010000", "decode/tp1", "debug", "room 3 failed",
                          win + ",\"is_from_another_rank\":\"true\",\"superseded_by\":\"decode/tp0\""),
                 "decode-tp1.jsonl", set);
  parse_log_text(line("01.002000", "prefill/tp1", "debug", "room failed",
                      "\"room\":\"3\",\"code\":\"waiting_timeout\",\"origin\":\"decode/tp1\",\"reason\":\"r1\"") +
                     line("01.020000", "prefill/tp1", "debug", "room 3 failed", win + ",\"is_from_another_rank\":\"true\""),
                 "prefill-tp1.jsonl", set);
  auto rooms = failed_rooms(set);
  ASSERT_EQ(rooms.size(), 1u);
  EXPECT_EQ(rooms[0].origin, "decode/tp0");
  EXPECT_EQ(rooms[0].reason, "r0");
  EXPECT_EQ(rooms[0].superseded, std::vector<std::string>{"decode/tp1"});
  auto j = nlohmann::json::parse(failed_rooms_json(rooms));
  EXPECT_EQ(j[0]["superseded"], nlohmann::json({"decode/tp1"}));
}

TEST(RootCause, JsonShape) {
  auto j = nlohmann::json::parse(failed_rooms_json(failed_rooms(skewed())));
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["room"], "7");
  EXPECT_EQ(j[0]["origin"], "decode/tp1");
  EXPECT_EQ(j[0]["code"], "injected");
  EXPECT_EQ(j[0]["reason"], "boom");
  EXPECT_EQ(j[0]["ranks"], nlohmann::json({"decode/tp1", "prefill/tp1", "prefill/tp0", "decode/tp0"}));
  EXPECT_EQ(j[0]["path"][1]["via"], "decode/tp1");
}

}  // namespace
}  // namespace kvferry::logs
