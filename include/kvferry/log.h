// Logging: a named logger per component, one JSON object per line (file sink) and short text
// lines to stderr for warning and above. Built on spdlog (kept out of this header).
//
// JSON line keys: ts (ISO-8601 UTC with microseconds), mono_ns (CLOCK_MONOTONIC), level
// (trace/debug/info/warning/error/critical), rank ("prefill/tp1", or the process's role name),
// component, msg, and when given: room (decimal string), code, origin, reason (the failure
// record's fields, so `kvferry logs` reads them instead of parsing msg), plus any extra fields.
// Thread contract: all functions thread-safe after init_logging().
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvferry/error.h"

namespace kvferry {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarning, kError, kCritical };
std::string_view level_name(LogLevel l);

struct LogConfig {
  std::string rank;                 // written as "rank" on every line
  std::string json_path;            // empty: no file sink
  LogLevel file_level = LogLevel::kDebug;
  LogLevel stderr_level = LogLevel::kWarning;
};

void init_logging(const LogConfig& config);
void flush_logging();

struct LogFields {
  std::optional<uint64_t> room;
  std::string code;    // code_name(), empty when none
  std::string origin;  // RankId::str(), empty when none
  std::vector<std::pair<std::string, std::string>> extra;  // more string fields
  std::string reason;  // the failure's reason, empty when none
};

// The fields of a line about a failure of `room`: room, code, origin, reason.
LogFields failure_log_fields(uint64_t room, const Failure& f);

void log_event(LogLevel level, std::string_view component, std::string_view msg,
               const LogFields& fields = {});

// Callback sink (how the Python module hands kvferry's lines to Python's `logging`): called for
// every line at or above `min_level`, synchronously, on whichever thread logged it (the caller's,
// the transport's progress thread, a heartbeat thread...), with no kvferry lock held. It must be
// quick, must not throw, and must not block on anything a logging thread may hold (the Python
// module only queues the line). While a callback is installed the stderr text sink is skipped:
// the callback's owner decides what is shown. The JSON file sink is unaffected.
// Pass an empty function to remove it; the call returns once no thread is still inside the old
// callback, so its owner may then be destroyed.
using LogCallback = std::function<void(LogLevel level, std::string_view component, std::string_view msg,
                                       const LogFields& fields)>;
void set_log_callback(LogCallback callback, LogLevel min_level = LogLevel::kDebug);

// Number of lines logged above debug since start (for self-checks).
uint64_t lines_above_debug();

}  // namespace kvferry
