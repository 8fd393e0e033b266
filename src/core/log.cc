// Logging on spdlog: JSON lines to a file, short text lines to stderr (see log.h).
//
// Two spdlog loggers share one process-wide state: `json` (basic_file_sink_mt, pattern "%v", one
// JSON object per line) and `text` (stderr_sink_mt, pattern "%v"). The state is swapped whole by
// init_logging(); log_event() takes a reference under a short lock, so it is thread-safe.
#include "kvferry/log.h"

#include <spdlog/logger.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <atomic>
#include <shared_mutex>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "kvferry/error.h"

namespace kvferry {
namespace {

struct LogState {
  LogConfig config;
  std::shared_ptr<spdlog::logger> json;  // null: no file sink
  std::shared_ptr<spdlog::logger> text;
};

spdlog::level::level_enum to_spdlog(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarning: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kCritical: return spdlog::level::critical;
  }
  return spdlog::level::info;
}

std::shared_ptr<spdlog::logger> make_text_logger(LogLevel level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("kvferry_stderr", std::move(sink));
  logger->set_pattern("%v");
  logger->set_level(to_spdlog(level));
  return logger;
}

std::mutex g_mu;
std::shared_ptr<const LogState> g_state;  // guarded by g_mu
std::atomic<uint64_t> g_above_debug{0};

// The callback sink: readers (log_event) hold the shared lock while calling it, so
// set_log_callback() (exclusive) returns only once no call of the old callback is running.
std::shared_mutex g_cb_mu;
LogCallback g_cb;  // guarded by g_cb_mu
std::atomic<int> g_cb_level{-1};  // -1: no callback

std::shared_ptr<const LogState> current_state() {
  std::lock_guard lock(g_mu);
  if (!g_state) {  // before init_logging(): stderr only, warning and above
    auto s = std::make_shared<LogState>();
    s->text = make_text_logger(LogLevel::kWarning);
    g_state = std::move(s);
  }
  return g_state;
}

// "2024-05-01T12:34:56.123456Z"
std::string iso8601_utc_now() {
  const auto now = std::chrono::system_clock::now();
  const int64_t us =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const time_t secs = static_cast<time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(((us % 1000000) + 1000000) % 1000000));
  return buf;
}

bool reserved_key(const std::string& k) {
  for (const char* r : {"ts", "mono_ns", "level", "rank", "component", "msg", "room", "code", "origin", "reason"}) {
    if (k == r) return true;
  }
  return false;
}

std::string json_line(const LogState& s, LogLevel level, std::string_view component, std::string_view msg,
                      const LogFields& f) {
  nlohmann::json j;
  j["ts"] = iso8601_utc_now();
  j["mono_ns"] = monotonic_ns();
  j["level"] = level_name(level);
  j["rank"] = s.config.rank;
  j["component"] = component;
  j["msg"] = msg;
  if (f.room) j["room"] = std::to_string(*f.room);
  if (!f.code.empty()) j["code"] = f.code;
  if (!f.origin.empty()) j["origin"] = f.origin;
  if (!f.reason.empty()) j["reason"] = f.reason;
  for (const auto& [k, v] : f.extra) j[reserved_key(k) ? "extra_" + k : k] = v;
  // Invalid UTF-8 (e.g. bytes from a peer) is replaced rather than thrown.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string text_line(const LogState& s, LogLevel level, std::string_view component, std::string_view msg,
                      const LogFields& f) {
  std::string out = "[";
  out += level_name(level);
  out += "] ";
  out += s.config.rank.empty() ? std::string("-") : s.config.rank;
  out += ' ';
  out += component;
  out += ": ";
  out += msg;
  std::string detail;
  if (f.room) detail = "room " + std::to_string(*f.room);
  if (!f.code.empty()) detail += (detail.empty() ? "" : ", ") + f.code;
  if (!f.origin.empty()) detail += (detail.empty() ? "at " : " at ") + f.origin;
  if (!detail.empty()) out += " (" + detail + ")";
  return out;
}

}  // namespace

std::string_view level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
    case LogLevel::kCritical: return "critical";
  }
  return "unknown";
}

void init_logging(const LogConfig& config) {
  auto s = std::make_shared<LogState>();
  s->config = config;
  s->text = make_text_logger(config.stderr_level);
  std::string open_error;
  if (!config.json_path.empty()) {
    try {
      auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(config.json_path, /*truncate=*/false);
      s->json = std::make_shared<spdlog::logger>("kvferry_json", std::move(sink));
      s->json->set_pattern("%v");
      s->json->set_level(to_spdlog(config.file_level));
      // Every line reaches the file at once: a rank stopped by SIGTERM or SIGKILL keeps its debug
      // lines (the attribution chain, "rank X learned of room R from Y", is mostly debug).
      s->json->flush_on(spdlog::level::trace);
    } catch (const std::exception& e) {
      open_error = e.what();
    }
  }
  std::shared_ptr<const LogState> old;
  {
    std::lock_guard lock(g_mu);
    old = std::move(g_state);
    g_state = s;
  }
  if (old && old->json) old->json->flush();
  if (!open_error.empty()) {
    LogFields f;
    f.extra = {{"path", config.json_path}, {"error", open_error}};
    log_event(LogLevel::kError, "log", "cannot open JSON log file; logging to stderr only", f);
  }
}

void flush_logging() {
  auto s = current_state();
  if (s->json) s->json->flush();
  s->text->flush();
}

void set_log_callback(LogCallback callback, LogLevel min_level) {
  std::unique_lock lock(g_cb_mu);
  g_cb = std::move(callback);
  g_cb_level.store(g_cb ? static_cast<int>(min_level) : -1);
}

void log_event(LogLevel level, std::string_view component, std::string_view msg, const LogFields& fields) {
  if (level > LogLevel::kDebug) g_above_debug.fetch_add(1, std::memory_order_relaxed);
  auto s = current_state();
  const int cb_level = g_cb_level.load();
  try {
    if (s->json && s->json->should_log(to_spdlog(level))) {
      s->json->log(to_spdlog(level), json_line(*s, level, component, msg, fields));
    }
    if (cb_level >= 0) {
      std::shared_lock lock(g_cb_mu);
      if (g_cb && static_cast<int>(level) >= g_cb_level.load()) g_cb(level, component, msg, fields);
    } else if (s->text->should_log(to_spdlog(level))) {
      s->text->log(to_spdlog(level), text_line(*s, level, component, msg, fields));
    }
  } catch (...) {
    // Logging must never take the process down; a failed line is lost.
  }
}

LogFields failure_log_fields(uint64_t room, const Failure& f) {
  LogFields out;
  out.room = room;
  out.code = std::string(code_name(f.code));
  out.origin = f.origin.str();
  out.reason = f.reason;
  return out;
}

uint64_t lines_above_debug() { return g_above_debug.load(std::memory_order_relaxed); }

}  // namespace kvferry
