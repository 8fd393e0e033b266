// FaultInjectingTransport: a Transport decorator for tests and replay fault plans
// (docs/transport.md "Fault injection"). Forwards every call to the wrapped transport, except write() batches
// that hit an armed fault or a hold/delay. Nothing in the transport layer needs it: a rank runs on
// the bare transport unless a fault plan or a test asks for the decorator.
//
// Faults: per room (every later write tagged with that room fails until clear_room) and, for
// tests, "the next n writes" regardless of room. A room fault wins over fail_next_writes (the
// counter is not consumed by a write that a room fault already failed). A failed batch completes
// with the armed Status (done called exactly once, on the decorator's own thread, never inside
// write(); nothing is forwarded, so nothing reaches the peer). Faults are decided when write() is
// called.
//
// Holds and delays keep a room's writes in flight: a write of a held room is queued and forwarded
// (and so completed, by the wrapped transport) only after release_held(room); with
// delay_room(room, d) each later write is forwarded d after its write() call. A room's queued
// writes are forwarded in the order they were written, and a write of a room that still has
// queued writes queues behind them (a room's batches never overtake each other). This lets a test
// show that a decode room is not release-safe while a prefill write can still land.
//
// Thread contract: every method may be called from any thread; the fault set is mutex-protected.
// Forwarding happens on the decorator's own thread.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kvferry/transport.h"

namespace kvferry {

class FaultInjectingTransport : public Transport {
 public:
  explicit FaultInjectingTransport(std::unique_ptr<Transport> inner);
  // Completes every queued (held or delayed) write with kTransferError without forwarding it,
  // and runs every pending injected completion, before returning.
  ~FaultInjectingTransport() override;

  // Every later write() tagged with `room` completes with Status(code, reason).
  void fail_room(uint64_t room, ErrorCode code, std::string reason);
  void clear_room(uint64_t room);
  // Test-only: the next n write() calls (any room) complete with `code`.
  void fail_next_writes(size_t n, ErrorCode code);
  // Number of write() batches failed by an injected fault so far.
  uint64_t injected_failures() const { return injected_.load(); }

  // Corruption in flight: after `skip` of them, the next write() batch of `room` carrying at least
  // one byte (a room's first chunk goes to its destinations in order: skip = the destination's
  // index) has the
  // first byte of its first non-empty op flipped (XOR 0xff) in the source memory just before it is
  // forwarded, and restored when the batch completes, so that one copy lands wrong at the peer
  // while the transport reports success (and the source keeps its bytes). Once per call; host
  // memory registered through this decorator only. The room's integrity check must catch it.
  void corrupt_next_write(uint64_t room, size_t skip = 0);
  // Batches corrupted so far.
  uint64_t corrupted_writes() const { return corrupted_.load(); }

  // Later writes of `room` are queued until release_held(room).
  void hold_room(uint64_t room);
  // Ends the hold of `room`; its queued writes are forwarded (after their delay, if any).
  void release_held(uint64_t room);
  // Each later write of `room` is forwarded `delay` after its write() call; 0 ends the delay
  // (writes queued meanwhile still wait for theirs).
  void delay_room(uint64_t room, std::chrono::milliseconds delay);
  // Writes of `room` queued and not yet forwarded.
  size_t queued_writes(uint64_t room) const;
  // Writes forwarded after a hold or a delay, so far.
  uint64_t forwarded_late() const { return forwarded_late_.load(); }

  // Test-only: later connect() calls wait, on their caller's thread, until release_connects()
  // (or the decorator is destroyed); then they are forwarded.
  void hold_connects();
  void release_connects();
  // connect() calls waiting in a hold now.
  size_t held_connects() const;

  // Test-only: tells the peer error handler that `peer`'s endpoint failed with `status`, as the
  // wrapped transport does when it fails one (a spurious failure: the endpoint itself stays up).
  // Runs the handler on the caller's thread; nothing happens before a handler is set.
  void report_peer_error(PeerId peer, Status status);

  Transport& inner() { return *inner_; }

  // Transport: forwarded.
  Result<LocalRegion> create_region(uint64_t bytes) override;
  Result<std::vector<LocalRegion>> register_spans(const std::vector<MemorySpan>& spans) override;
  TransportCaps caps() const override;
  std::string address() const override;
  Result<PeerId> connect(const RemoteRegionInfo& peer) override;
  Status connect_reverse(const std::string& peer_address) override;
  void disconnect(PeerId peer) override;
  void write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
             std::function<void(Status)> done) override;
  void set_peer_error_handler(std::function<void(PeerId, Status)> handler) override;
  void set_write_fence(std::shared_ptr<WriteFence> fence) override;
  // The inner transport's stats; injected failures count as batches and failed_batches.
  TransportStats stats() const override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Queued {
    PeerId peer = 0;
    std::vector<WriteOp> ops;
    std::function<void(Status)> done;
    Clock::time_point due;
  };
  struct RoomQueue {
    std::deque<Queued> writes;
    int forwarding = 0;  // popped, being forwarded outside the lock
  };

  void run();
  // Under mu_: a room whose front write may be forwarded now, or 0 with *next the earliest due.
  bool take_ready(uint64_t* room, Queued* out, Clock::time_point* next);

  std::unique_ptr<Transport> inner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Status> rooms_;
  size_t next_failures_ = 0;
  ErrorCode next_code_ = ErrorCode::kInjected;
  std::deque<std::pair<std::function<void(Status)>, Status>> completions_;
  std::unordered_set<uint64_t> held_;
  std::unordered_map<uint64_t, std::chrono::milliseconds> delays_;
  std::unordered_map<uint64_t, RoomQueue> queued_;  // rooms with queued or forwarding writes
  std::function<void(PeerId, Status)> peer_error_handler_;  // a copy of the one set, under mu_
  bool stopping_ = false;
  bool connects_held_ = false;
  size_t connects_waiting_ = 0;
  std::condition_variable connect_cv_;
  std::atomic<uint64_t> injected_{0};
  std::atomic<uint64_t> forwarded_late_{0};
  std::atomic<uint64_t> corrupted_{0};
  std::unordered_map<uint64_t, size_t> corrupt_;  // room -> non-empty batches to let by first
  std::vector<LocalRegion> local_regions_;      // registered through this decorator (corruption)
  // Under no lock: flips the byte of `ops`' first non-empty op; its address, or null.
  uint8_t* flip_first_byte(const std::vector<WriteOp>& ops);
  std::thread worker_;  // last: started after everything above exists
};

}  // namespace kvferry
