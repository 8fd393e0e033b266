#include "driver/job_worker.h"

#include <sys/resource.h>
#include <unistd.h>

#include <utility>

namespace kvferry {

JobWorker::JobWorker() : thread_([this] { run(); }) {}

JobWorker::~JobWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void JobWorker::submit(Job job, OnError on_error) {
  ++pending_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.emplace_back(std::move(job), std::move(on_error));
  }
  cv_.notify_one();
}

size_t JobWorker::drain() {
  waker_.drain();  // before taking the completions: a job finishing now signals again
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(done_);
  }
  for (auto& c : done) {
    --pending_;
    if (c) c();
  }
  return done.size();
}

void JobWorker::run() {
  // Bulk work yields to the latency-critical threads (main loop, heartbeats, ZeroMQ I/O) of every
  // rank on the machine: on 2 cores a replay runs 5+ processes.
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
  for (;;) {
    std::pair<Job, OnError> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      item = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Completion c;
    try {
      c = item.first();
    } catch (const std::exception& e) {
      c = [on_error = std::move(item.second), what = std::string(e.what())] { if (on_error) on_error(what); };
    } catch (...) {
      c = [on_error = std::move(item.second)] { if (on_error) on_error("unknown exception"); };
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(std::move(c));
    }
    waker_.signal();
  }
}

}  // namespace kvferry
