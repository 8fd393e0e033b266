// StallClock: how long the thread that judges a peer's silence was itself not running its loop.
//
// A deadline such as "no heartbeat for 800 ms" or "no reply to the engine's step for 600 ms" is a
// judgement about a peer, made by a loop that must have been running to hear it. On a saturated
// host a whole VM, or every process of a replay, can be descheduled at once (measured here: all
// four ranks of a 2+2 replay silent for 2.1-2.9 s together); when the judge runs again, the peer
// has not had a chance to answer yet. So the silence that counts is the silence the judge was
// awake for: the loop calls tick() once per iteration with the real monotonic time, every gap
// between two ticks beyond `allowance_ns` (the loop's normal period plus slack) is added to
// stalled_ns(), and a silence that began when stalled_ns() was S is worth
// `now - since - (stalled_ns() - S)` (silence()). A peer that is really dead is still reported one
// deadline after it went silent, plus the judge's own stalls in between, never earlier.
// Thread contract: one thread (the loop's).
#pragma once
#include <algorithm>
#include <cstdint>

namespace kvferry {

class StallClock {
 public:
  explicit StallClock(int64_t allowance_ns) : allowance_ns_(allowance_ns) {}

  // One loop iteration at real time `now_ns`; returns stalled_ns().
  int64_t tick(int64_t now_ns) {
    if (last_ns_ != 0 && now_ns - last_ns_ > allowance_ns_) {
      const int64_t stall = now_ns - last_ns_ - allowance_ns_;
      stalled_ns_ += stall;
      max_stall_ns_ = std::max(max_stall_ns_, stall);
    }
    last_ns_ = std::max(last_ns_, now_ns);
    return stalled_ns_;
  }
  // Total time the loop was stalled beyond its allowance so far.
  int64_t stalled_ns() const { return stalled_ns_; }
  // The longest single stall (beyond the allowance).
  int64_t max_stall_ns() const { return max_stall_ns_; }
  // The part of [since_ns, now_ns] the judge was awake for, given stalled_ns() was `stalled_at`
  // at since_ns (never negative).
  int64_t silence(int64_t now_ns, int64_t since_ns, int64_t stalled_at) const {
    return std::max<int64_t>(0, now_ns - since_ns - (stalled_ns_ - stalled_at));
  }

 private:
  int64_t allowance_ns_;
  int64_t last_ns_ = 0;
  int64_t stalled_ns_ = 0;
  int64_t max_stall_ns_ = 0;
};

}  // namespace kvferry
