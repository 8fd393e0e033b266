// What a rank's driver (PrefillDriver, DecodeDriver) reports of its rooms and of itself, from the
// public API only (kvferry/manager.h): a room's failure as its Sender/Receiver holds it, this
// rank's own failure for the release line (manager/log_policy.h), the failure fields of a
// RoomReport, and the rank's leak statistics from ManagerStats.
// Thread contract: the rank's main thread, like the drivers.
#pragma once
#include <optional>

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

// This rank's own local failure of the room, if it had one (the record, or one it superseded).
std::optional<Failure> own_failure(const std::optional<KVTransferError>& e, const RankId& self);

// The failure fields of a rank's report of a failed room.
void report_failure(RoomReport& rep, const KVTransferError& e);

// The rank's leak statistics from its manager's (live_rooms and pages_in_use as the manager
// counts them; a driver adds its own rooms and pages).
RankLeakStats leak_stats_of(const RankId& self, const ManagerStats& m);

}  // namespace kvferry
