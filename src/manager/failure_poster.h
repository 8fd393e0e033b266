// FailurePoster: posts the failures a rank observed to the failure board of the room's bootstrap
// service (src/bootstrap/failure_board.h, docs/failure-model.md), off the caller's and the progress
// thread: post() queues and returns; one thread, started on the first post, sends them in order.
// The queue holds at most kMaxQueued records (a post beyond it is dropped and counted); each HTTP
// call is bounded by kPostTimeoutMs. The board is a help for ranks that learn of a failure only from
// their engine's agreement, never needed for a room to fail: a lost post costs only their origin.
// Thread contract: post() and dropped() from any thread; the destructor stops the thread and drops
// what is still queued.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "kvferry/error.h"

namespace kvferry {

class FailurePoster {
 public:
  static constexpr size_t kMaxQueued = 4096;
  static constexpr int kPostTimeoutMs = 1000;

  FailurePoster() = default;
  ~FailurePoster();
  FailurePoster(const FailurePoster&) = delete;
  FailurePoster& operator=(const FailurePoster&) = delete;

  // `address`: the bootstrap service ("host:port"); empty: nothing is posted.
  void post(const std::string& address, uint64_t room, const Failure& f);
  uint64_t posted() const;   // answered 200
  uint64_t dropped() const;  // queue full, or the service refused or could not be reached

 private:
  struct Item {
    std::string address;
    uint64_t room;
    Failure record;
  };
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  uint64_t posted_ = 0;
  uint64_t dropped_ = 0;
  std::thread thread_;
};

}  // namespace kvferry
