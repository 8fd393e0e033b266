// The replay report: classification of every request, byte counts, throughput, latency
// percentiles, fault attribution and an independent count of log lines per room.
// docs/report.md documents every field of report.json.
//
// Classification of one request (from both engines' RoomResults):
//   rejected   decode result has rejected == true (can never fit the pools; not a failure)
//   succeeded  both engines report Success
//   failed     everything else (including a request the router gave up on)
// Faults: an injected fault that failed its room is listed in `faults` with the observed origin
// (the decode result's origin; when the engines name different origins both are listed, which
// never equals the injected rank, so it counts as misattributed). A fault whose room succeeded
// or was rejected anyway (the faulty rank never got to act) goes to `faults_not_applied`.
// Thread contract: pure functions, except scan_log_files (reads files).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "replay/results.h"

namespace kvferry::replay {

// Lines above debug per room, and validity of every line (JSON object with string ts, level,
// rank, msg; level one of trace/debug/info/warning/error/critical).
struct LogScan {
  uint64_t files = 0;
  uint64_t lines = 0;
  uint64_t invalid_lines = 0;
  std::string first_invalid;                       // "<file>:<line>: <problem>"
  std::map<std::string, uint64_t> above_debug_by_room;  // room (decimal) -> count
};
// Adds one file's text to `scan` (`file` names it in problems).
void scan_log_text(std::string_view text, const std::string& file, LogScan& scan);
// Scans every *.jsonl in `dir` (non-recursive).
LogScan scan_log_files(const std::string& dir);

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
  uint64_t count = 0;
};
// Nearest-rank percentiles (the smallest value with at least p% of values <= it). Empty: zeros.
Percentiles percentiles(std::vector<double> values);

struct FaultEntry {
  std::string room;  // decimal
  std::string kind;
  std::string injected_at;
  std::string observed_origin;
  std::string code;
  std::string reason;
  std::string outcome;  // "failed", "succeeded", "rejected" (faults_not_applied only)
  uint64_t lines_above_debug = 0;
  uint32_t ranks_failed = 0;
  double time_to_all_failed_ms = 0;
  bool attributed() const { return observed_origin == injected_at; }
};

struct FailureEntry {
  std::string room;
  std::string origin;
  std::string code;
  std::string reason;
};

struct RejectedEntry {
  std::string room;
  uint64_t input_tokens = 0;
  std::string reason;
};

struct Report {
  uint64_t total = 0, succeeded = 0, failed = 0, rejected = 0;
  uint64_t bytes_transferred = 0, bytes_verified = 0, bytes_mismatched = 0;
  double transfer_seconds = 0;   // first dispatch to last result
  double throughput_gb_per_s = 0;  // bytes_transferred / transfer_seconds / 1e9
  Percentiles transfer_latency_ms;
  std::vector<RejectedEntry> rejected_requests;
  std::vector<FaultEntry> faults;
  std::vector<FaultEntry> faults_not_applied;
  std::vector<FailureEntry> unexpected_failures;
  LogScan logs;
  std::vector<std::string> process_problems;  // from the orchestrator (e.g. a rank exited non-zero)
  std::vector<std::string> process_exits;     // "prefill/tp0 (pid 12) exited with code 0", ...
  uint64_t faults_misattributed() const;
  uint64_t faults_not_one_line() const;  // faults whose lines_above_debug != 1
  // Problems that make `kvferry replay` exit 1 (empty: the replay is clean).
  std::vector<std::string> problems() const;
};

Report build_report(const ReplayResults& results, const LogScan& logs);

// report.json text: the report plus `config` (a JSON object text), `wall_s`, `leaks` from the
// engines' stats, and `status`/`error` ("ok" or "failed" with the orchestrator's message).
std::string report_json(const Report& report, const ReplayResults& results,
                        const std::string& config_json, double wall_s, const std::string& error);
// A report for a replay that stopped early: config, status "failed", error, and whatever
// results were available (may be none).
std::string partial_report_json(const std::string& config_json, double wall_s,
                                const std::string& error);

// A few human lines: requests, ok/failed/rejected, GB moved, GB/s, p50/p99, faults x/y, mismatches.
std::string summary_text(const Report& report, double wall_s);

}  // namespace kvferry::replay
