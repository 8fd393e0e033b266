#include "transport/ucx/command_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace kvferry::ucx {

CommandQueue::CommandQueue() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

CommandQueue::~CommandQueue() {
  if (fd_ >= 0) ::close(fd_);
}

bool CommandQueue::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    queue_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  // A full counter (EAGAIN) still leaves the fd readable, which is all we need.
  [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof(one));
  return true;
}

size_t CommandQueue::run_pending() {
  uint64_t counter = 0;
  [[maybe_unused]] ssize_t n = ::read(fd_, &counter, sizeof(counter));
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(queue_);
  }
  for (auto& fn : batch) fn();
  return batch.size();
}

bool CommandQueue::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty();
}

void CommandQueue::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

}  // namespace kvferry::ucx
