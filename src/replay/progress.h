// Progress of a running replay, from the router's `<results>.progress` snapshots (router.h):
// requests finished (succeeded, failed, rejected, classified as in report.h), KV bytes written so
// far, throughput since the first dispatch. Also the subset of finished requests a partial report
// is built from when the replay is stopped early.
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <string>

#include "replay/results.h"

namespace kvferry::replay {

struct Progress {
  uint64_t total = 0, dispatched = 0, finished = 0, succeeded = 0, failed = 0, rejected = 0;
  uint64_t bytes = 0;     // KV bytes written by prefill ranks (finished requests)
  double seconds = 0;     // since the first dispatch (0 before it)
  double gb_per_s() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }
};

// A request has both engines' results, or the router gave up on it.
bool request_finished(const RequestOutcome& q);
// `now_ns`: CLOCK_MONOTONIC (the clock of the results' times).
Progress progress_of(const ReplayResults& r, int64_t now_ns);
// "replay: 120/200 requests done (ok 116, failed 3, rejected 1), 12.34 GB moved, 1.234 GB/s, 10 s"
std::string progress_line(const Progress& p);
// One terminal line, `width` columns at most: "[#####.....] 120/200 ok 116 failed 3 ... GB/s".
std::string progress_bar(const Progress& p, size_t width);
// Only the finished requests (a partial report counts nothing that was still running).
ReplayResults finished_only(const ReplayResults& r);

}  // namespace kvferry::replay
