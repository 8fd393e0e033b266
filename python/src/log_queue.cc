#include "log_queue.h"

#include <chrono>

namespace kvferry::python {

LogQueue& LogQueue::instance() {
  // Never destroyed: a kvferry thread may still log during interpreter shutdown.
  static LogQueue* q = new LogQueue();
  return *q;
}

void LogQueue::install(LogLevel min_level) {
  {
    std::lock_guard lock(mu_);
    stopped_ = false;
  }
  set_log_callback(
      [this](LogLevel level, std::string_view component, std::string_view msg, const LogFields& f) {
        push({level, std::string(component), std::string(msg), f.room, f.code, f.origin, f.extra});
      },
      min_level);
}

void LogQueue::uninstall() {
  set_log_callback({});
  std::lock_guard lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

void LogQueue::push(QueuedLine line) {
  std::lock_guard lock(mu_);
  if (lines_.size() >= kCapacity) {
    lines_.pop_front();
    ++dropped_;
  }
  lines_.push_back(std::move(line));
  cv_.notify_all();
}

std::vector<QueuedLine> LogQueue::take(int timeout_ms) {
  std::unique_lock lock(mu_);
  if (timeout_ms > 0)
    cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return stopped_ || !lines_.empty(); });
  std::vector<QueuedLine> out(std::make_move_iterator(lines_.begin()), std::make_move_iterator(lines_.end()));
  lines_.clear();
  return out;
}

bool LogQueue::wait(int timeout_ms) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return stopped_ || !lines_.empty(); });
  return !lines_.empty();
}

uint64_t LogQueue::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

}  // namespace kvferry::python
