// Where a rank's drivers and engine loop feed its metrics (include/kvferry/metrics.h). Every
// function is a no-op in a process without metrics (rank_metrics() null, e.g. unit tests).
// Thread contract: the rank's main thread.
#pragma once
#include <cstdint>
#include <vector>

#include "driver/engine.h"

namespace kvferry {

// Gauges from this rank's own reports of one step and the driver's leak statistics; at most every
// 50 ms unless `force` (the last step before exit).
void metrics_on_step(const EngineDriver& driver, const std::vector<RoomReport>& own, int64_t now_ns,
                     bool force);

// One room released on this rank.
struct ReleasedRoom {
  bool failed = false;
  ErrorCode code = ErrorCode::kOk;  // failed: the room's agreed code
  bool from_another_rank = false;   // failed: this rank learned the cause from another rank
  double latency_s = -1;            // < 0: none observed
  uint64_t sent_bytes = 0;          // prefill
  uint64_t verified_bytes = 0;      // decode
  uint64_t mismatched_bytes = 0;    // decode
};
void metrics_on_release(const ReleasedRoom& r);

}  // namespace kvferry
