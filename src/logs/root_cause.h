// `kvferry logs`: one timeline per room merged from every process's log, and for each failed room
// its root cause and how it reached every other rank.
//
// A room failed when a line about it carries a `code` and an `origin`. Its agreed cause is the
// (origin, code) most ranks' release lines name (the lines with is_from_another_rank), else the
// one most lines name; the reason is those lines' "reason" field (the origin's own first).
// Ranks whose own failure lost the root-cause rule are listed in `superseded` (from the
// "superseded_by" field of their lines), never as a second origin.
// The root-cause event: the origin rank's first line of the room naming that code; when the origin
// wrote none (a dead rank), the first peer_dead line about it, else the first line naming it.
//
// Causal order (clock skew): ranks' wall clocks may disagree, so the merge never trusts `ts`
// alone. Each rank's first failure line of a room ("learned") must come after the event that told
// it: the `via` rank's learned line when the line names one (a status message, or the engine
// leader's per-step decision), else the root-cause event (every propagation starts at the origin).
// Lines are merged in each file's own order, taking the earliest `ts` among lines whose cause is
// already placed. The ranks that saw the failure are listed in that order, the origin first.
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "logs/log_set.h"

namespace kvferry::logs {

struct RankPath {
  std::string rank;         // "prefill/tp0"
  std::string ts;           // its learned line's ts (its own clock)
  std::string via;          // who told it ("" when the line does not say)
  std::string how;          // "root cause", "status from X", "engine agreement from X", "propagated"
  std::string level;        // the highest level it logged for the room
  std::optional<bool> is_from_another_rank;  // from its release line, when present
};

struct FailedRoom {
  uint64_t room = 0;
  std::string origin;       // "decode/tp1"
  std::string code;
  std::string reason;
  std::string time;         // ts of the root-cause event ("" if none found)
  std::string logged_by;    // the rank whose line is the root-cause event
  std::string root_line;    // that line's msg
  std::vector<RankPath> ranks;            // engine ranks that saw it, causal order
  std::vector<std::string> superseded;    // ranks whose own failure lost to the origin (name order)
  std::vector<const LogLine*> timeline;   // every line of the room, causal order
};

// Every line of `room`, merged in causal order (pointers into `set`).
std::vector<const LogLine*> room_timeline(const LogSet& set, uint64_t room);

// Every failed room (by first appearance in the causal merge of all rooms: ordered by the root
// cause's ts, then room id). `only`: just that room (empty if it did not fail).
std::vector<FailedRoom> failed_rooms(const LogSet& set, std::optional<uint64_t> only = std::nullopt);

// JSON array, one object per failed room: room (decimal string), origin, code, reason, time,
// logged_by, ranks (names, causal order), path ([{rank, ts, via, how, level}]), superseded.
std::string failed_rooms_json(const std::vector<FailedRoom>& rooms);

// Human text: the root cause line, then one line per rank; with `timeline`, every line too.
std::string failed_room_text(const FailedRoom& room, bool timeline);

}  // namespace kvferry::logs
