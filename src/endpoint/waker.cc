#include "endpoint/waker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>

namespace kvferry {

Waker::Waker() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Waker::~Waker() {
  if (fd_ >= 0) close(fd_);
}

void Waker::signal() {
  uint64_t one = 1;
  ssize_t n = write(fd_, &one, sizeof one);
  (void)n;  // EAGAIN means it is already signalled
}

void Waker::drain() {
  uint64_t v;
  ssize_t n = read(fd_, &v, sizeof v);
  (void)n;
}

void wait_readable(const int* fds, int nfds, int timeout_ms) {
  pollfd p[8];
  int n = 0;
  for (int i = 0; i < nfds && n < 8; ++i) {
    if (fds[i] >= 0) p[n++] = {fds[i], POLLIN, 0};
  }
  ::poll(p, n, timeout_ms);
}

}  // namespace kvferry
