// A queue of closures run by one owner thread, with an eventfd that becomes readable whenever a
// closure is posted (so the owner can sleep in poll() together with other fds).
// Thread contract: post()/close() from any thread; run_pending() only on the owner thread.
#pragma once
#include <deque>
#include <functional>
#include <mutex>

namespace kvferry::ucx {

class CommandQueue {
 public:
  CommandQueue();
  ~CommandQueue();
  CommandQueue(const CommandQueue&) = delete;
  CommandQueue& operator=(const CommandQueue&) = delete;

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }  // readable while commands are pending

  // Queues fn and wakes the owner. Returns false (fn dropped) once close() was called.
  bool post(std::function<void()> fn);
  // Clears the wakeup, then runs every queued closure in order. Returns how many ran.
  size_t run_pending();
  bool empty() const;
  // Later post() calls fail; already queued closures still run on the next run_pending().
  void close();

 private:
  mutable std::mutex mu_;
  std::deque<std::function<void()>> queue_;
  bool closed_ = false;
  int fd_ = -1;
};

}  // namespace kvferry::ucx
