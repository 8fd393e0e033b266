// What a rank's driver (PrefillDriver, DecodeDriver) does with a room's failure and reports of its
// rooms and of itself, from the public API only (kvferry/manager.h): failing a room, applying the
// engine's kFail, a room's failure as its Sender/Receiver holds it, this
// rank's own failure for the release line (manager/log_policy.h), the failure fields of a
// RoomReport, and the rank's leak statistics from ManagerStats.
// Thread contract: the rank's main thread, like the drivers.
#pragma once
#include <optional>
#include <string>

#include "driver/engine.h"
#include "kvferry/error.h"
#include "kvferry/manager.h"

namespace kvferry {

// The room's failure as this rank knows it: its handle's failure(), else the driver's own record
// (`Room` has fields handle, a Sender or Receiver pointer, null when the manager refused it, and
// local_failure).
template <class Room>
std::optional<KVTransferError> room_failure(const Room& r) {
  return r.handle ? r.handle->failure() : r.local_failure;
}

// The room fails here: its handle's fail() (origin this rank, observed at `observed_ns`; 0: now),
// or without a handle the driver's own record.
template <class Room>
void fail_room(Room& r, ErrorCode code, const std::string& reason, const RankId& self, int64_t observed_ns = 0) {
  if (r.handle) r.handle->fail(code, reason, observed_ns);
  else if (!r.local_failure) r.local_failure = KVTransferError{0, code, reason, self, false, observed_ns ? observed_ns : monotonic_ns()};
}

// The engine's kFail decision `d` for room `r` on this rank: the leader's own failure (it observed
// it: origin this rank) with the decision's instant, else the engine's failure from another rank
// (fail_from_engine), so every rank names the same root cause.
template <class Room>
void apply_engine_failure(Room& r, const Decision& d, const RankId& self) {
  auto origin = RankId::parse(d.origin);
  Failure f = failure_of(d);
  f.origin = origin ? *origin : self;
  if (d.observed_by_leader && f.origin == self) fail_room(r, f.code, f.reason, self, d.first_seen_ns);
  else if (r.handle) r.handle->fail_from_engine(KVTransferError::from(d.room, f, true));
  else if (!r.local_failure) r.local_failure = KVTransferError::from(d.room, f, true);
  if (r.failed_ns == 0) r.failed_ns = monotonic_ns();
  r.failure = d;
  r.fail_decided = true;
}

// This rank's own local failure of the room, if it had one (the record, or one it superseded).
std::optional<Failure> own_failure(const std::optional<KVTransferError>& e, const RankId& self);

// The failure fields of a rank's report of a failed room.
void report_failure(RoomReport& rep, const KVTransferError& e);

// The rank's leak statistics from its manager's (live_rooms and pages_in_use as the manager
// counts them; a driver adds its own rooms and pages).
RankLeakStats leak_stats_of(const RankId& self, const ManagerStats& m);

}  // namespace kvferry
