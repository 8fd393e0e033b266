// FailureRegistry: per-manager map room -> the room's root cause as this rank knows it
// (docs/failure-model.md "Registry").
//
// - A room must be open()ed before failures attach to it; a record for a room that is not open
//   (never opened, or already released) is dropped and counted, so a late record can never attach
//   to a later room that reuses the id (docs/design.md §4 defect 2, docs/failure-model.md).
// - The primary is the root cause by the root-cause rule (failure_precedes, kvferry/error.h) over
//   the room's candidates known here: this rank's first local observation, if it came before the
//   rank knew of any failure of the room, and every record that reached it from another rank. A
//   later candidate that wins replaces the primary; the loser is kept in the primary's
//   `superseded` list ("superseded by ORIGIN"). A local observation made after the room already had
//   a record is a consequence, never a candidate: it is kept as secondary detail only.
//   Hence the primary is a function of the SET of candidates, not of their arrival order.
// - get() is non-destructive: asking twice gives the same answer (docs/design.md §4 defect 1).
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

  // Records a failure of the room. `observed_here` is true only where this rank observed the
  // failure itself (then a missing wall_ns is stamped from first_seen_ns, a CLOCK_MONOTONIC stamp of
  // this host). A failure that names this rank as origin but reached it in a message (e.g. a
  // restarted rank blamed for its previous incarnation's death) is not observed here.
  // Returns true if the record became the room's primary (its first, or a winner that replaced the
  // primary); false if it lost or was a duplicate (kept as detail) or the room is not open (dropped).
  bool record(uint64_t room, const Failure& f, bool observed_here);
  // The same, with `observed_here` = (origin == self).
  bool record(uint64_t room, ErrorCode code, std::string reason, RankId origin, int64_t first_seen_ns);
  bool record(uint64_t room, ErrorCode code, std::string reason, RankId origin, int64_t first_seen_ns,
              bool observed_here);

  // The room's primary (root cause as known here, with its `superseded` losers), or nullopt if it
  // has none. Non-destructive.
  std::optional<KVTransferError> get(uint64_t room) const;
  // This rank's own local observation of the room that was a candidate (it may have lost: then it
  // is not get()'s record), or nullopt.
  std::optional<Failure> own(uint64_t room) const;
  // Later records of the same room that were not candidates or lost (at most 4 kept), in arrival
  // order; a superseded primary is among them too.
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
