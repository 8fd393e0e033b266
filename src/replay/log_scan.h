// The replay's independent log check (report.h): every line of every rank's and the router's
// JSON log (DIR/logs/*.jsonl) is validated and the lines above debug are counted per room;
// "peer_dead" events are collected for the peer-death attribution, "stale_refused" ones for the
// restarts (incarnations). docs/report.md ("logs").
// Thread contract: scan_log_text is a pure function; scan_log_files reads files.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kvferry::replay {

// Lines above debug per room, and validity of every line (JSON object with string ts, level,
// rank, msg; level one of trace/debug/info/warning/error/critical).
struct LogScan {
  uint64_t files = 0;
  uint64_t lines = 0;
  uint64_t invalid_lines = 0;
  std::string first_invalid;                       // "<file>:<line>: <problem>"
  std::map<std::string, uint64_t> above_debug_by_room;  // room (decimal) -> count
  struct PeerDead {  // a line with "event":"peer_dead"
    std::string rank;  // the line's rank (the detector)
    std::string peer;
    int64_t mono_ns = 0;
    bool above_debug = false;
    std::string msg;  // the line's message (why the peer was declared dead)
    // "<rank> declared <peer> dead", with ": <msg>" when the line had one.
    std::string describe() const { return rank + " declared " + peer + " dead" + (msg.empty() ? "" : ": " + msg); }
  };
  std::vector<PeerDead> peer_dead;
  // Lines with "event":"stale_refused": a message refused for its incarnation (kvferry/messages.h),
  // `peer` its sender, `kind` the message's name.
  struct StaleRefused {
    std::string rank;
    std::string peer;
    std::string kind;
    int64_t mono_ns = 0;
  };
  std::vector<StaleRefused> stale_refused;
};
// Adds one file's text to `scan` (`file` names it in problems).
void scan_log_text(std::string_view text, const std::string& file, LogScan& scan);
// Scans every *.jsonl in `dir` (non-recursive).
LogScan scan_log_files(const std::string& dir);

}  // namespace kvferry::replay
