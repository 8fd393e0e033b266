#include "replay/log_scan.h"

#include <gtest/gtest.h>

#include <string>

namespace kvferry::replay {
namespace {

TEST(LogScan, CountsLinesAboveDebugPerRoomAndValidates) {
  LogScan scan;
  const std::string a =
      R"({"ts":"t","level":"debug","rank":"decode/tp0","msg":"m","room":"11"})" "\n"
      R"({"ts":"t","level":"error","rank":"decode/tp0","msg":"m","room":"11"})" "\n"
      "\n"
      R"({"ts":"t","level":"info","rank":"decode/tp0","msg":"no room"})" "\r\n"
      R"({"ts":"t","level":"warning","rank":"prefill/tp1","msg":"m","room":"12"})" "\n";
  scan_log_text(a, "a.jsonl", scan);
  EXPECT_EQ(scan.lines, 4u);
  EXPECT_EQ(scan.invalid_lines, 0u);
  EXPECT_EQ(scan.above_debug_by_room.at("11"), 1u);
  EXPECT_EQ(scan.above_debug_by_room.at("12"), 1u);
  const std::string b =
      R"({"ts":"t","level":"critical","rank":"decode/tp1","msg":"m","room":"11"})" "\n"
      "not json\n"
      R"({"ts":"t","level":"loud","rank":"x","msg":"m"})" "\n"
      R"({"ts":"t","level":"info","msg":"m"})" "\n"
      R"({"ts":"t","level":"trace","rank":"r","msg":"m","room":"13"})";
  scan_log_text(b, "b.jsonl", scan);
  EXPECT_EQ(scan.lines, 9u);
  EXPECT_EQ(scan.invalid_lines, 3u);
  EXPECT_EQ(scan.first_invalid, "b.jsonl:2: not a JSON object");
  EXPECT_EQ(scan.above_debug_by_room.at("11"), 2u);
  EXPECT_EQ(scan.above_debug_by_room.count("13"), 0u);
}

TEST(LogScan, NumericRoomIsCountedButFlagged) {
  LogScan scan;
  scan_log_text(R"({"ts":"t","level":"error","rank":"r","msg":"m","room":5})", "c.jsonl", scan);
  EXPECT_EQ(scan.above_debug_by_room.at("5"), 1u);
  EXPECT_EQ(scan.invalid_lines, 1u);
}

TEST(LogScan, CollectsPeerDeadLines) {
  LogScan scan;
  scan_log_text(
      R"({"ts":"t","level":"error","rank":"decode/tp1","msg":"no heartbeat for 900 ms","event":"peer_dead","peer":"prefill/tp1","mono_ns":123})"
      "\n"
      R"({"ts":"t","level":"debug","rank":"prefill/tp2","msg":"m","event":"peer_dead","peer":"prefill/tp1","mono_ns":5})"
      "\n"
      R"({"ts":"t","level":"error","rank":"decode/tp1","msg":"m","event":"other","peer":"prefill/tp1"})"
      "\n",
      "x.jsonl", scan);
  ASSERT_EQ(scan.peer_dead.size(), 2u);
  EXPECT_EQ(scan.peer_dead[0].rank, "decode/tp1");
  EXPECT_EQ(scan.peer_dead[0].peer, "prefill/tp1");
  EXPECT_EQ(scan.peer_dead[0].mono_ns, 123);
  EXPECT_TRUE(scan.peer_dead[0].above_debug);
  EXPECT_EQ(scan.peer_dead[0].describe(), "decode/tp1 declared prefill/tp1 dead: no heartbeat for 900 ms");
  EXPECT_FALSE(scan.peer_dead[1].above_debug);
  EXPECT_EQ(scan.invalid_lines, 0u);
}

}  // namespace
}  // namespace kvferry::replay
