// FailurePoster (manager/failure_poster.h).
#include "manager/failure_poster.h"

#include <fmt/format.h>

#include <map>
#include <memory>

#include "kvferry/bootstrap.h"
#include "kvferry/log.h"

namespace kvferry {

FailurePoster::~FailurePoster() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void FailurePoster::post(const std::string& address, uint64_t room, const Failure& f) {
  if (address.empty()) return;
  std::lock_guard lock(mu_);
  if (stop_) return;
  if (queue_.size() >= kMaxQueued) {
    ++dropped_;
    return;
  }
  queue_.push_back({address, room, f});
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  cv_.notify_one();
}

uint64_t FailurePoster::posted() const {
  std::lock_guard lock(mu_);
  return posted_;
}

uint64_t FailurePoster::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

void FailurePoster::run() {
  std::map<std::string, std::unique_ptr<BootstrapClient>> clients;  // this thread's only
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    auto& client = clients[item.address];
    if (!client) {
      if (clients.size() > 64) clients.clear();  // one manager talks to few services
      client = std::make_unique<BootstrapClient>(item.address, kPostTimeoutMs);
    }
    const Status s = client->post_failure(item.room, item.record);
    if (!s.ok())
      log_event(LogLevel::kDebug, "manager",
                fmt::format("room {}: its failure could not be posted to the failure board at {}: {}", item.room,
                            item.address, s.str()),
                {.room = item.room});
    lock.lock();
    ++(s.ok() ? posted_ : dropped_);
  }
}

}  // namespace kvferry
