// LogQueue: kvferry's log lines on their way to Python's `logging` (python/kvferry/_logging.py).
//
// install() sets the log callback sink (kvferry/log.h): any kvferry thread that logs only copies
// the line into this bounded queue (no Python, no GIL), so logging can never deadlock with the
// interpreter. Python threads take() lines (waiting with the GIL released) and emit them with the
// GIL held. When the queue is full the oldest line is dropped and counted (dropped()).
// uninstall() removes the sink and wakes every waiter (interpreter exit).
// Thread contract: all methods thread-safe.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvferry/log.h"

namespace kvferry::python {

struct QueuedLine {
  LogLevel level = LogLevel::kInfo;
  std::string component;
  std::string msg;
  std::optional<uint64_t> room;
  std::string code;
  std::string origin;
  std::vector<std::pair<std::string, std::string>> extra;
};

class LogQueue {
 public:
  static constexpr size_t kCapacity = 65536;
  static LogQueue& instance();

  void install(LogLevel min_level);
  void uninstall();
  void push(QueuedLine line);
  // Waits up to timeout_ms for at least one line (0: no wait); empty when stopped or timed out.
  std::vector<QueuedLine> take(int timeout_ms);
  // Waits up to timeout_ms until a line is queued or the queue is stopped; true if lines wait.
  bool wait(int timeout_ms);
  uint64_t dropped() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<QueuedLine> lines_;
  uint64_t dropped_ = 0;
  bool stopped_ = false;
};

}  // namespace kvferry::python
