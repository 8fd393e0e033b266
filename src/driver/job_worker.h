// JobWorker: one background thread that runs heavy per-room work (filling prefill pages,
// verifying decode pages) off the rank's main loop. A job returns a completion that runs on the
// main thread (drain()), so room state is only ever touched by the main thread. A finished job
// makes fd() readable (an eventfd) until the next drain(): the main loop waits on it.
// Thread contract: submit()/drain()/fd() from the main thread; jobs run on the worker thread.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "endpoint/waker.h"

namespace kvferry {

class JobWorker {
 public:
  using Completion = std::function<void()>;
  using Job = std::function<Completion()>;
  // Runs on the main thread when a job threw; the worker itself keeps going (docs/design.md §4 defect 6).
  using OnError = std::function<void(const std::string& what)>;

  JobWorker();
  ~JobWorker();  // finishes queued jobs' threads without running completions
  void submit(Job job, OnError on_error);
  // Runs completions of finished jobs; returns how many ran.
  size_t drain();
  size_t pending() const { return pending_; }
  int fd() const { return waker_.fd(); }

 private:
  void run();
  Waker waker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Job, OnError>> jobs_;
  std::vector<Completion> done_;
  size_t pending_ = 0;  // submitted, completion not yet run (main thread only)
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvferry
