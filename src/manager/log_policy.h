// The one logging policy for failed rooms (docs/manager.md "Failure logging"), used wherever a driver
// or a manager learns that a room failed. Tested as a table in log_policy_test.cc.
//
//   situation                                   decode driver   prefill driver
//   local failure (this rank is the origin)     error           warning
//   local resource exhaustion (rejection)       warning         warning
//   propagated (is_from_another_rank)           debug           debug
//   abort by the client, on the rank that got it info          info
// Thread contract: pure function.
#pragma once
#include "kvferry/error.h"
#include "kvferry/log.h"

namespace kvferry {

LogLevel failure_log_level(Role role, bool is_from_another_rank, ErrorCode code);

}  // namespace kvferry
