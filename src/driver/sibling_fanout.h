// The engine fan-out's driver side, shared by PrefillDriver and DecodeDriver (engine.h,
// SiblingFailure): which failures this rank sends to its siblings and how a sibling's failure is
// applied. Everything goes through the
// room's public handle (kvferry/manager.h Sender or Receiver). `Rooms` maps room id -> the
// driver's Room, with fields handle (the Sender/Receiver; null when the manager refused it),
// local_failure (the room's failure without a handle), failed_ns, failure_seen, fail_decided,
// siblings_know.
// Thread contract: the rank's main thread, like the drivers.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "driver/engine.h"
#include "driver/room_report.h"
#include "kvferry/error.h"
#include "kvferry/log.h"

namespace kvferry {

// Failures this rank has seen since the last call (first-hand, or from the other engine) that no
// sibling has yet: each room once. A failure decided by the engine (kFail) or learned from a
// sibling is not sent.
template <class Rooms>
std::vector<SiblingFailure> collect_fan_out(Rooms& rooms, const RankId& self) {
  std::vector<SiblingFailure> out;
  const int64_t now = monotonic_ns();
  for (auto& [id, r] : rooms) {
    if (r.failure_seen) continue;
    std::optional<KVTransferError> e = room_failure(r);
    if (!e) continue;
    r.failure_seen = true;
    if (r.failed_ns == 0) r.failed_ns = now;
    if (r.fail_decided || r.siblings_know) continue;
    r.siblings_know = true;
    out.push_back({id, self.tp_rank, e->code, e->origin.str(), e->failure_reason, e->first_seen_ns, e->wall_ns});
  }
  return out;
}

// Applies a sibling's failure as a failure from another rank (fail_from_engine: debug log only;
// the manager tells this rank's peers in the other engine). False when this rank does not have
// the room (yet).
template <class Rooms>
bool apply_sibling_failure(Rooms& rooms, const SiblingFailure& f, std::string_view component) {
  auto it = rooms.find(f.room);
  if (it == rooms.end()) return false;
  auto& r = it->second;
  if (!RankId::parse(f.origin)) return true;  // the codec rejects such frames
  const KVTransferError e = KVTransferError::from(f.room, failure_of(f), true);
  const bool had = room_failure(r).has_value();
  if (r.handle) r.handle->fail_from_engine(e);  // the manager keeps the root cause by the rule
  else if (!r.local_failure) r.local_failure = e;
  if (had) return true;  // its own record (if not sent yet) still goes out
  r.siblings_know = true;
  if (r.failed_ns == 0) r.failed_ns = monotonic_ns();
  if (!room_failure(r))  // the room's transfer had concluded here: nothing logged it
    log_event(LogLevel::kDebug, component,
              fmt::format("room failed after its transfer concluded: {} at {} (via tp{})", code_name(f.code), f.origin,
                          f.tp_rank),
              {.room = f.room, .code = std::string(code_name(f.code)), .origin = f.origin});
  return true;
}

}  // namespace kvferry
