// The failure board of the bootstrap service (docs/failure-model.md "Ranks that learn a failure only
// from their engine's agreement"): the rank that observed a room's failure posts the record here,
// and a rank whose engine agreed the room failed, without any kvferry message about it, looks the
// room's root cause up here before it raises, so every rank of both engines names the same origin.
//
//   POST /failure  body {"room": "<u64>", code, origin, reason, first_seen_ns, wall_ns}
//                  (the failure record's JSON fields, core/failure_json.h)      -> 200 {"ok":true}
//   GET  /failure?room=R                                                       -> 200 the room's record
//                  nothing posted for R (yet)                                  -> 404
//
// The board keeps per room the record that wins by the root-cause rule (kvferry/error.h
// failure_precedes), so the order posts arrive in does not matter. Peers are untrusted: the body
// is decoded completely (400 naming the field otherwise); wall_ns must be set and within
// kFailureBoardClockSlackNs of this host's clock (a record stamped far ahead or behind could win
// the rule against every true one); reasons are cut to kFailureBoardReasonBytes; entries live
// kFailureBoardTtlNs; at most kFailureBoardRoomsPerSource rooms per source address (a post beyond
// it is refused with 429 and changes nothing) and kFailureBoardRooms in all (the oldest record
// goes to make room: a record is asked for within seconds of its post).
// Thread contract: FailureBoard is guarded by its own mutex.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json_fwd.hpp>

#include "bootstrap/sglang_routes.h"
#include "kvferry/error.h"

namespace kvferry::bootstrap {

constexpr size_t kFailureBoardRooms = 65536;
constexpr size_t kFailureBoardRoomsPerSource = 16384;
constexpr size_t kFailureBoardReasonBytes = 512;
constexpr int64_t kFailureBoardTtlNs = 120'000'000'000;          // 2 minutes
constexpr int64_t kFailureBoardClockSlackNs = 300'000'000'000;   // 5 minutes

class FailureBoard {
 public:
  // `source`: the request's source address; `now_ns` CLOCK_MONOTONIC, `wall_now_ns` CLOCK_REALTIME.
  Reply post(const nlohmann::json& body, const std::string& source, int64_t now_ns, int64_t wall_now_ns);
  // `room`: the query value as given (nullptr: absent).
  Reply get(const std::string* room, int64_t now_ns);
  size_t size() const;

 private:
  struct Entry {
    Failure record;
    std::string source;  // who posted the record held (the per-source count)
    int64_t posted_ns = 0;
  };
  void expire(int64_t now_ns);  // under mu_
  void drop(uint64_t room);     // under mu_

  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> rooms_;
  std::deque<std::pair<uint64_t, int64_t>> order_;  // (room, posted ns), oldest first
  std::map<std::string, size_t> per_source_;
};

}  // namespace kvferry::bootstrap
