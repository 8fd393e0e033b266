// The one logging policy for failed rooms (docs/manager.md "Failure logging",
// docs/failure-model.md), used wherever a driver or a manager learns that a room failed. Tested as
// a table in log_policy_test.cc.
//
//   situation                                   decode driver   prefill driver
//   local failure (this rank is the origin)     error           warning
//   local resource exhaustion (rejection)       warning         warning
//   propagated (is_from_another_rank)           debug           debug
//   abort by the client, on the rank that got it info          info
//   own local failure that lost the root-cause  debug, "superseded by ORIGIN"
//   rule to another rank's
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "kvferry/error.h"
#include "kvferry/log.h"

namespace kvferry {

LogLevel failure_log_level(Role role, bool is_from_another_rank, ErrorCode code);

// The line a rank logs when its engine releases a failed room. `root` is the engine's root cause
// (the agreement's winner); `own` is this rank's own local failure of the room, if it had one
// (FailureRegistry::own). The root cause is local here exactly when `own` is it; an own failure
// that lost is logged at debug with "superseded by ORIGIN" and its record as `superseded_*` fields.
struct FailureLine {
  LogLevel level = LogLevel::kDebug;
  bool is_from_another_rank = true;
  std::string msg;
  LogFields fields;
};
FailureLine failure_release_line(Role role, uint64_t room, const Failure& root, const std::optional<Failure>& own);

}  // namespace kvferry
