// DecodeDriver: the scheduler side of a decode rank (docs/design.md §1 "driver").
//   preallocation queue: rooms wait (FIFO) for free pages and an aux slot; the leader admits a
//                        room when its pages fit (kAdmit) and every rank allocates the same pages in
//                        lockstep; a room that can never fit the pool is rejected (a failure with
//                        code resource_exhausted, origin the leader);
//   transfer queue:      admitted receivers wait for Success; then a worker thread verifies every
//                        byte of the room against the deterministic content;
//   release:             when every rank verified (Success) or the room Failed and no prefill write
//                        can still reach its pages and aux row (drained: the receiver's
//                        release_safe()), the leader decides kRelease: pages and aux row return to
//                        the pool, or both are quarantined if the drain deadline passed.
// Built on a caller-pumped Manager (kvferry/manager.h), its endpoint driven through
// manager/manager_internal.h. Thread contract: main thread only (see EngineLoop).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "driver/engine.h"
#include "driver/job_worker.h"
#include "endpoint/decode_endpoint.h"
#include "endpoint/page_allocator.h"
#include "kvferry/manager.h"

namespace kvferry {

class DecodeDriver : public EngineDriver {
 public:
  explicit DecodeDriver(Manager& manager);
  ~DecodeDriver() override;

  void apply(const Decision& d) override;
  void pump(int64_t now_ns) override;
  std::vector<RoomReport> reports(int64_t now_ns) override;
  std::vector<Decision> decide(const std::map<uint64_t, std::vector<RoomReport>>& by_room,
                               std::vector<RouterRequest> new_requests, int64_t now_ns,
                               std::vector<RoomResult>* results) override;
  std::vector<SiblingFailure> take_failures_to_fan_out() override;
  bool on_sibling_failure(const SiblingFailure& f) override;
  RankLeakStats leak_stats() const override;
  bool idle() const override { return rooms_.empty(); }

  uint64_t quarantined_pages() const { return quarantined_; }
  uint64_t quarantined_aux_rows() const { return quarantined_aux_; }

 private:
  struct Room {
    RouterRequest req;
    uint64_t pages_needed = 0;
    int64_t created_ns = 0;
    bool admitted = false;
    std::vector<uint64_t> kv_indices;
    std::optional<uint64_t> aux_slot;
    bool verify_started = false;
    bool verify_done = false;
    uint64_t verified = 0;
    uint64_t mismatched = 0;
    int64_t failed_ns = 0;
    bool siblings_know = false;  // the fan-out: told, or learned from a sibling
    bool fail_decided = false;
    Decision failure;
  };
  void log_release(uint64_t room, const Room& r, const Decision& release);
  void start_verify(uint64_t room, Room& r);

  EndpointCore& core_;
  DecodeEndpoint& ep_;
  PageAllocator pages_;
  PageAllocator aux_;
  JobWorker verifier_;
  std::map<uint64_t, Room> rooms_;
  std::deque<uint64_t> prealloc_;  // leader only: rooms waiting for pages, in arrival order
  uint64_t quarantined_ = 0;
  uint64_t quarantined_aux_ = 0;  // aux rows a late prefill write may still reach
};

}  // namespace kvferry
