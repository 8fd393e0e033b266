#include "kvferry/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvferry {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvferry_log_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << line;
    out.push_back(j);
  }
  return out;
}

TEST(Log, LevelNames) {
  EXPECT_EQ(level_name(LogLevel::kTrace), "trace");
  EXPECT_EQ(level_name(LogLevel::kDebug), "debug");
  EXPECT_EQ(level_name(LogLevel::kInfo), "info");
  EXPECT_EQ(level_name(LogLevel::kWarning), "warning");
  EXPECT_EQ(level_name(LogLevel::kError), "error");
  EXPECT_EQ(level_name(LogLevel::kCritical), "critical");
}

TEST(Log, JsonLinesHaveTheKeys) {
  const std::string path = temp_path("json.log");
  std::filesystem::remove(path);
  LogConfig cfg;
  cfg.rank = "prefill/tp1";
  cfg.json_path = path;
  cfg.file_level = LogLevel::kDebug;
  cfg.stderr_level = LogLevel::kCritical;
  init_logging(cfg);

  const uint64_t before = lines_above_debug();
  log_event(LogLevel::kTrace, "test", "below the file level");  // not written, not counted
  log_event(LogLevel::kDebug, "test", "a debug line");          // written, not counted
  LogFields room_only;
  room_only.room = 18446744073709551615ull;  // the largest room must survive as a string
  log_event(LogLevel::kInfo, "sender", "room \"quoted\" done", room_only);
  LogFields full;
  full.room = 42;
  full.code = "transfer_error";
  full.origin = "decode/tp0";
  full.extra = {{"peer", "10.0.0.1:5000"}, {"msg", "collides with a reserved key"}};
  log_event(LogLevel::kError, "worker", "write failed", full);
  flush_logging();
  EXPECT_EQ(lines_above_debug() - before, 2u);

  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& j : lines) {
    for (const char* k : {"ts", "mono_ns", "level", "rank", "component", "msg"}) {
      EXPECT_TRUE(j.contains(k)) << k << " in " << j.dump();
    }
    EXPECT_EQ(j["rank"], "prefill/tp1");
    EXPECT_TRUE(j["mono_ns"].is_number_integer());
    const std::string ts = j["ts"];
    ASSERT_EQ(ts.size(), 27u) << ts;  // 2024-05-01T12:34:56.123456Z
    EXPECT_EQ(ts[10], 'T');
    EXPECT_EQ(ts[19], '.');
    EXPECT_EQ(ts.back(), 'Z');
  }
  EXPECT_EQ(lines[0]["level"], "debug");
  EXPECT_FALSE(lines[0].contains("room"));
  EXPECT_EQ(lines[1]["level"], "info");
  EXPECT_EQ(lines[1]["component"], "sender");
  EXPECT_EQ(lines[1]["msg"], "room \"quoted\" done");
  ASSERT_TRUE(lines[1]["room"].is_string());
  EXPECT_EQ(lines[1]["room"], "18446744073709551615");
  EXPECT_EQ(lines[2]["level"], "error");
  EXPECT_EQ(lines[2]["room"], "42");
  EXPECT_EQ(lines[2]["code"], "transfer_error");
  EXPECT_EQ(lines[2]["origin"], "decode/tp0");
  EXPECT_EQ(lines[2]["peer"], "10.0.0.1:5000");
  EXPECT_EQ(lines[2]["msg"], "write failed");
  EXPECT_EQ(lines[2]["extra_msg"], "collides with a reserved key");
  EXPECT_LE(lines[1]["mono_ns"].get<int64_t>(), lines[2]["mono_ns"].get<int64_t>());
  std::filesystem::remove(path);
}

TEST(Log, AFailuresReasonIsAField) {
  const std::string path = temp_path("reason.log");
  std::filesystem::remove(path);
  LogConfig cfg;
  cfg.rank = "decode/tp0";
  cfg.json_path = path;
  cfg.stderr_level = LogLevel::kCritical;
  init_logging(cfg);
  const Failure f{ErrorCode::kWaitingTimeout, RankId{Role::kDecode, 0, 1, 0}, "no data: \"at\" 400 ms", 5, 6};
  LogFields fields = failure_log_fields(9, f);
  EXPECT_EQ(fields.code, "waiting_timeout");
  EXPECT_EQ(fields.origin, "decode/tp1");
  fields.extra.push_back({"reason", "an extra may not hide the record's reason"});
  log_event(LogLevel::kDebug, "test", "room failed", fields);
  flush_logging();
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["room"], "9");
  EXPECT_EQ(lines[0]["code"], "waiting_timeout");
  EXPECT_EQ(lines[0]["origin"], "decode/tp1");
  EXPECT_EQ(lines[0]["reason"], "no data: \"at\" 400 ms");
  EXPECT_EQ(lines[0]["extra_reason"], "an extra may not hide the record's reason");
  std::filesystem::remove(path);
}

TEST(Log, FileLevelFilters) {
  const std::string path = temp_path("filtered.log");
  std::filesystem::remove(path);
  LogConfig cfg;
  cfg.rank = "decode/tp0";
  cfg.json_path = path;
  cfg.file_level = LogLevel::kWarning;
  cfg.stderr_level = LogLevel::kCritical;
  init_logging(cfg);
  log_event(LogLevel::kInfo, "c", "dropped");
  log_event(LogLevel::kWarning, "c", "kept");
  auto lines = read_lines(path);  // warning flushes by itself, without flush_logging()
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["msg"], "kept");
  EXPECT_EQ(lines[0]["level"], "warning");
  std::filesystem::remove(path);
}

TEST(Log, StderrThreshold) {
  LogConfig cfg;
  cfg.rank = "decode/tp3";
  cfg.stderr_level = LogLevel::kError;
  init_logging(cfg);  // no file sink
  LogFields f;
  f.room = 7;
  testing::internal::CaptureStderr();
  log_event(LogLevel::kWarning, "receiver", "not shown", f);
  log_event(LogLevel::kError, "receiver", "timed out", f);
  flush_logging();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "[error] decode/tp3 receiver: timed out (room 7)\n");
}

TEST(Log, CallbackGetsLinesAtItsLevelAndReplacesStderr) {
  LogConfig cfg;
  cfg.rank = "prefill/tp0";
  cfg.stderr_level = LogLevel::kDebug;
  init_logging(cfg);
  struct Seen {
    LogLevel level;
    std::string component, msg, code;
    std::optional<uint64_t> room;
  };
  std::vector<Seen> seen;
  set_log_callback(
      [&](LogLevel l, std::string_view c, std::string_view m, const LogFields& f) {
        seen.push_back({l, std::string(c), std::string(m), f.code, f.room});
      },
      LogLevel::kInfo);
  testing::internal::CaptureStderr();
  log_event(LogLevel::kDebug, "endpoint", "below the callback's level");
  log_event(LogLevel::kWarning, "endpoint", "room failed", {.room = 9, .code = "transfer_error"});
  flush_logging();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");  // the callback's owner decides
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].level, LogLevel::kWarning);
  EXPECT_EQ(seen[0].component, "endpoint");
  EXPECT_EQ(seen[0].msg, "room failed");
  EXPECT_EQ(seen[0].code, "transfer_error");
  EXPECT_EQ(seen[0].room, std::optional<uint64_t>(9));

  set_log_callback({});  // removed: stderr again, the callback no more
  testing::internal::CaptureStderr();
  log_event(LogLevel::kWarning, "endpoint", "back on stderr");
  flush_logging();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "[warning] prefill/tp0 endpoint: back on stderr\n");
  EXPECT_EQ(seen.size(), 1u);
}

}  // namespace
}  // namespace kvferry
