// FailureRegistry: per-manager map room -> first failure cause (DESIGN §3 "Registry").
//
// - A room must be open()ed before failures attach to it; a record for a room that is not open
//   (never opened, or already released) is dropped and counted, so a late record can never attach
//   to a later room that reuses the id (DESIGN §4 defect 2).
// - First cause wins; later causes are kept as secondary detail (bounded), not new errors.
// - get() is non-destructive: asking twice gives the same answer (DESIGN §4 defect 1).
// - release() removes the room and its record.
// Thread contract: all methods are thread-safe (one internal mutex).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvferry/error.h"

namespace kvferry {

class FailureRegistry {
 public:
  explicit FailureRegistry(RankId self);
  ~FailureRegistry();
  FailureRegistry(const FailureRegistry&) = delete;
  FailureRegistry& operator=(const FailureRegistry&) = delete;

  // Starts tracking a room. Re-opening an open room is a no-op (returns false).
  bool open(uint64_t room);
  bool is_open(uint64_t room) const;

  // Records a failure cause. Returns true if it became the room's (first) cause, false if the room
  // already had one (kept as secondary) or is not open (dropped). `is_from_another_rank` of the
  // stored error is computed as (origin != self).
  bool record(uint64_t room, ErrorCode code, std::string reason, RankId origin, int64_t first_seen_ns);
  // The same with the fact stated explicitly: `observed_here` is true only where this rank observed
  // the failure itself. A failure that names this rank as origin but reached it in a message (e.g. a
  // restarted rank blamed for its previous incarnation's death) is still from another rank.
  bool record(uint64_t room, ErrorCode code, std::string reason, RankId origin, int64_t first_seen_ns,
              bool observed_here);

  // The room's first cause, or nullopt if it has none. Non-destructive.
  std::optional<KVTransferError> get(uint64_t room) const;
  // Later causes of the same room (at most 4 kept).
  std::vector<KVTransferError> secondary(uint64_t room) const;

  // Stops tracking the room; its record goes with it. Returns false if it was not open.
  bool release(uint64_t room);

  size_t open_rooms() const;
  size_t records() const;
  uint64_t dropped_records() const;  // records for rooms that were not open

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvferry
