#include "endpoint/connector.h"

#include <utility>

namespace kvferry {

Connector::~Connector() {
  std::list<Job> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs.swap(jobs_);
  }
  for (Job& j : jobs) j.thread.join();
}

bool Connector::start(uint64_t id, RemoteRegionInfo info) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t running = 0;
  for (const Job& j : jobs_) running += j.finished ? 0 : 1;
  if (running >= kMaxInFlight) return false;
  Job& job = jobs_.emplace_back();
  Job* raw = &job;  // std::list: stable while the job lives
  job.thread = std::thread([this, raw, id, info = std::move(info)] {
    Result<PeerId> peer = transport_.connect(info);
    {
      std::lock_guard<std::mutex> l(mu_);
      done_.push_back({id, std::move(peer)});
      raw->finished = true;
    }
    waker_.signal();
  });
  return true;
}

std::vector<Connector::Done> Connector::take_done() {
  std::vector<Done> out;
  std::list<Job> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.swap(done_);
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      auto next = std::next(it);
      if (it->finished) finished.splice(finished.end(), jobs_, it);
      it = next;
    }
  }
  for (Job& j : finished) j.thread.join();  // they have returned (or are returning) from the lambda
  return out;
}

size_t Connector::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t running = 0;
  for (const Job& j : jobs_) running += j.finished ? 0 : 1;
  return running;
}

}  // namespace kvferry
