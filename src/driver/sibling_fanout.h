// The engine fan-out's driver side, shared by PrefillDriver and DecodeDriver (engine.h,
// SiblingFailure): which fresh failures this rank sends to its siblings, and how a sibling's
// failure is applied. `Rooms` maps room id -> the driver's Room (fields failed_ns, fail_decided,
// siblings_know); `Endpoint` is the rank's PrefillEndpoint or DecodeEndpoint.
// Thread contract: the rank's main thread, like the drivers.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "driver/engine.h"
#include "endpoint/core.h"
#include "kvferry/error.h"
#include "kvferry/log.h"

namespace kvferry {

// Failures this rank recorded since the last call (first-hand, or from the other engine) that
// no sibling has yet: each room once. A room whose transfer had concluded here keeps its endpoint
// state and has no failed_ns there; this rank counts as Failed from now on.
template <class Rooms, class Endpoint>
std::vector<SiblingFailure> collect_fan_out(Rooms& rooms, Endpoint& ep, EndpointCore& core) {
  std::vector<SiblingFailure> out;
  const int64_t now = monotonic_ns();
  for (uint64_t id : ep.take_fresh_failures()) {
    auto it = rooms.find(id);
    if (it == rooms.end()) continue;
    if (it->second.failed_ns == 0) it->second.failed_ns = now;
    if (it->second.fail_decided || it->second.siblings_know) continue;
    auto e = core.registry().get(id);
    if (!e) continue;
    it->second.siblings_know = true;
    out.push_back({id, core.self().tp_rank, e->code, e->origin.str(), e->failure_reason, e->first_seen_ns, e->wall_ns});
  }
  return out;
}

// Applies a sibling's failure as a failure from another rank (debug log only; never sent on).
// False when this rank does not have the room (yet).
template <class Rooms, class Endpoint>
bool apply_sibling_failure(Rooms& rooms, Endpoint& ep, EndpointCore& core, const SiblingFailure& f,
                           std::string_view component) {
  auto it = rooms.find(f.room);
  if (it == rooms.end()) return false;
  auto& r = it->second;
  if (!RankId::parse(f.origin)) return true;  // the codec rejects such frames
  const RankId self = core.self(), via{self.role, self.engine_id, f.tp_rank, self.dp_rank};
  if (core.registry().get(f.room)) {  // the registry keeps the root cause by the rule
    ep.fail(f.room, failure_of(f), false, &via);
    return true;  // its own record (if fresh) still goes out
  }
  r.siblings_know = true;
  ep.fail(f.room, failure_of(f), false, &via);
  if (r.failed_ns == 0) r.failed_ns = monotonic_ns();
  if (ep.poll(f.room) != KVPoll::Failed)  // the endpoint's transfer had concluded: it logged nothing
    log_event(LogLevel::kDebug, component,
              fmt::format("room failed after its transfer concluded: {} at {}", code_name(f.code), f.origin),
              {.room = f.room, .code = std::string(code_name(f.code)), .origin = f.origin, .extra = {{"via", via.str()}}});
  return true;
}

}  // namespace kvferry
