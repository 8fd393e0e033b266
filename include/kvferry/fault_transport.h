// FaultInjectingTransport: a Transport decorator for tests and replay fault plans (DESIGN.md §5).
// Forwards every call to the wrapped transport, except write() batches that hit an armed fault:
// those complete with the armed Status instead (done called exactly once, on the decorator's own
// completion thread, never inside write(); nothing is forwarded, so nothing reaches the peer).
//
// Faults: per room (every later write tagged with that room fails until clear_room) and, for
// tests, "the next n writes" regardless of room. A room fault wins over fail_next_writes (the
// counter is not consumed by a write that a room fault already failed).
//
// Thread contract: every method may be called from any thread; the fault set is mutex-protected.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "kvferry/transport.h"

namespace kvferry {

class FaultInjectingTransport : public Transport {
 public:
  explicit FaultInjectingTransport(std::unique_ptr<Transport> inner);
  ~FaultInjectingTransport() override;

  // Every later write() tagged with `room` completes with Status(code, reason).
  void fail_room(uint64_t room, ErrorCode code, std::string reason);
  void clear_room(uint64_t room);
  // Test-only: the next n write() calls (any room) complete with `code`.
  void fail_next_writes(size_t n, ErrorCode code);
  // Number of write() batches failed by an injected fault so far.
  uint64_t injected_failures() const { return injected_.load(); }

  Transport& inner() { return *inner_; }

  // Transport: forwarded. The destructor first runs every pending injected completion.
  Result<LocalRegion> create_region(uint64_t bytes) override;
  Result<LocalRegion> register_region(uint8_t* base, uint64_t bytes) override;
  std::string address() const override;
  Result<PeerId> connect(const RemoteRegionInfo& peer) override;
  void disconnect(PeerId peer) override;
  void write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
             std::function<void(Status)> done) override;
  void set_peer_error_handler(std::function<void(PeerId, Status)> handler) override;
  // The inner transport's stats; injected failures count as batches and failed_batches.
  TransportStats stats() const override;

 private:
  void run_completions();

  std::unique_ptr<Transport> inner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, Status> rooms_;
  size_t next_failures_ = 0;
  ErrorCode next_code_ = ErrorCode::kInjected;
  std::deque<std::pair<std::function<void(Status)>, Status>> completions_;
  bool stopping_ = false;
  std::atomic<uint64_t> injected_{0};
  std::thread completer_;  // last: started after everything above exists
};

}  // namespace kvferry
