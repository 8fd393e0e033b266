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
//                        the pool, or both are quarantined if the drain deadline passed;
//   reclaim:             a quarantined room's pages and aux row are kept (kv_indices, aux slot) until
//                        its quarantine ends on every rank of the engine (the rank's endpoint hands
//                        it back, decode_quarantine.cc: every unconfirmed source confirmed the
//                        drain or died); each rank reports it (reclaim_reports()), the leader
//                        decides kReclaim once all tp_size ranks did, and every rank frees the same
//                        pages and aux row at that decision, so the allocators stay in lockstep.
//                        Pages of a room whose quarantine never ends on some rank (a live source
//                        never confirms; a rank of the engine is down) stay quarantined, counted.
//                        At most kMaxQuarantinedRooms rooms are kept (the oldest is dropped first,
//                        on every rank alike: its pages stay quarantined for good, still counted).
// Built on a caller-pumped Manager (kvferry/manager.h) and driven only through its public
// Receiver, as a serving engine drives it: receiver(room) and init() when the request arrives,
// send_metadata() at admission, poll()/failure() each step, pages freed only once release_safe()
// (kept while quarantined() until Manager::take_reclaimed_rooms() names the room).
// Thread contract: main thread only (see EngineLoop).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "driver/engine.h"
#include "driver/job_worker.h"
#include "endpoint/page_allocator.h"
#include "kvferry/manager.h"

namespace kvferry {

struct DecodeDriverConfig {
  uint32_t tp_size = 1;                // ranks of the engine (kReclaim needs every one)
  int64_t prealloc_timeout_ms = 60000;  // Deadlines::prealloc_timeout_ms
  // Replay timeout fault at this rank (RoomFaults::peers_silent): the room fails with
  // waiting_timeout if it has not succeeded this long after its metadata went out
  // (Deadlines::fault_timeout_ms).
  int64_t fault_timeout_ms = 1000;
};

class DecodeDriver : public EngineDriver {
 public:
  DecodeDriver(Manager& manager, DecodeDriverConfig config);
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
  std::vector<int> wait_fds() const override { return {verifier_.fd()}; }
  std::vector<RoomReport> reclaim_reports() const override;

  // Quarantined now (not yet reclaimed), and given back by kReclaim so far.
  uint64_t quarantined_pages() const { return quarantined_; }
  uint64_t quarantined_aux_rows() const { return quarantined_aux_; }
  uint64_t reclaimed_pages() const { return reclaimed_pages_; }
  uint64_t reclaimed_rooms() const { return reclaimed_rooms_; }
  size_t quarantined_rooms() const { return quarantine_.size(); }  // rooms that can still be reclaimed

  static constexpr size_t kMaxQuarantinedRooms = 1024;

 private:
  struct Room {
    RouterRequest req;
    std::unique_ptr<Receiver> handle;  // null: receiver(room) was refused (then local_failure)
    std::optional<KVTransferError> local_failure;
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
    int64_t fault_deadline_ns = 0;  // replay timeout fault here: waiting_timeout at this time
    bool failure_seen = false;   // the fan-out looked at its failure
    bool siblings_know = false;  // the fan-out: told, or learned from a sibling
    bool fail_decided = false;
    Decision failure;
  };
  // A room released quarantined: what kReclaim gives back (identical on every rank).
  struct Quarantined {
    std::vector<uint64_t> kv_indices;
    uint64_t aux_slot = 0;
    bool reclaimed_here = false;  // this rank's endpoint ended the quarantine
  };
  void log_release(uint64_t room, const Room& r, const Decision& release);
  void start_verify(uint64_t room, Room& r);
  void quarantine(uint64_t room, Room& r, bool quarantined_here);
  void reclaim(uint64_t room);
  // Leader: kReclaim for a quarantined room every rank reported reclaimed.
  void decide_reclaim(uint64_t room, const std::vector<RoomReport>& reps, std::vector<Decision>* out) const;

  Manager& manager_;
  DecodeDriverConfig cfg_;
  PageAllocator pages_;
  PageAllocator aux_;
  JobWorker verifier_;
  std::map<uint64_t, Room> rooms_;
  std::deque<uint64_t> prealloc_;  // leader only: rooms waiting for pages, in arrival order
  uint64_t quarantined_ = 0;
  uint64_t quarantined_aux_ = 0;  // aux rows a late prefill write may still reach
  std::map<uint64_t, Quarantined> quarantine_;  // at most kMaxQuarantinedRooms
  std::deque<uint64_t> quarantine_order_;       // quarantine_'s rooms, oldest first
  uint64_t reclaimed_pages_ = 0;  // pages and aux rows
  uint64_t reclaimed_rooms_ = 0;
};

}  // namespace kvferry
