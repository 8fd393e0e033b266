// The JSON-line logs of a run (include/kvferry/log.h gives the keys), read back for `kvferry logs`.
// Every *.jsonl file of a directory is read (a replay's DIR/logs, or DIR itself); a line that is
// not a JSON object with string "rank" and "msg" is counted in `invalid_lines`, never fatal.
// Times: `ts` is each process's wall clock (ranks on different hosts may be skewed), kept as
// microseconds since the Unix epoch; the order of lines within one file is the order the process
// wrote them.
// Thread contract: value types and pure functions (read_log_dir reads files).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::logs {

struct LogLine {
  std::string file;      // file name (no directory)
  size_t line_no = 0;    // 1-based
  std::string ts;        // as written ("2026-11-30T13:22:09.107424Z")
  int64_t ts_us = 0;     // ts as microseconds since the epoch (0: missing or malformed)
  std::string level;     // trace/debug/info/warning/error/critical
  std::string rank;      // "prefill/tp1", or a process role ("router", "bootstrap")
  std::string component;
  std::string msg;
  std::optional<uint64_t> room;
  std::string code;      // code_name(), "" when none
  std::string origin;    // RankId::str() of the failure's origin, "" when none
  std::string reason;    // the failure's reason (the "reason" field), "" when none
  std::string superseded_by;  // this rank's own failure lost to that origin ("" when not)
  std::string via;       // the rank whose message told this rank of the failure, "" when none
  std::string event;     // e.g. "peer_dead"
  std::string peer;      // with event peer_dead: the dead rank
  std::optional<bool> is_from_another_rank;
  bool above_debug() const { return level != "trace" && level != "debug"; }
};

struct LogSet {
  std::vector<LogLine> lines;  // file by file (files in name order), each in written order
  uint64_t files = 0;
  uint64_t invalid_lines = 0;
  std::string first_invalid;   // "<file>:<line>"
};

// "2026-11-30T13:22:09.107424Z" (fraction optional, 'Z' required) -> microseconds; nullopt if not.
std::optional<int64_t> parse_ts_us(std::string_view ts);

// Adds one file's text.
void parse_log_text(std::string_view text, const std::string& file, LogSet& out);

// Reads DIR/logs/*.jsonl when DIR/logs exists, else DIR/*.jsonl. Errors: kInvalidArgument when
// the directory cannot be read or holds no *.jsonl file.
Result<LogSet> read_log_dir(const std::string& dir);

}  // namespace kvferry::logs
