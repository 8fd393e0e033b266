// Waker: an eventfd that other threads signal to wake the rank's main loop out of poll().
// Thread contract: signal() from any thread; drain() and fd() by the owner.
#pragma once

namespace kvferry {

class Waker {
 public:
  Waker();
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  void signal();
  void drain();
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits until one of `fds` is readable or `timeout_ms` passes (poll(2); EINTR is a wake-up).
void wait_readable(const int* fds, int nfds, int timeout_ms);

}  // namespace kvferry
