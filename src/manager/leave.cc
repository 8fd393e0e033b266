// Manager::leave() and drained() (kvferry/manager.h; docs/failure-model.md "Leaving"): the first
// half of an orderly leave. No new rooms; the rooms handed out go on; a prefill rank removes its
// bootstrap entry (DELETE /route at its incarnation, include/kvferry/bootstrap.h) so that decode
// ranks looking the instance up from now on are told it left instead of waiting for it. The second
// half is the destructor's leaving heartbeat (endpoint/peer_monitor.cc).
#include <fmt/format.h>

#include <chrono>
#include <set>
#include <thread>

#include "kvferry/bootstrap.h"
#include "kvferry/log.h"
#include "manager/manager_internal.h"

namespace kvferry {

uint64_t ManagerImpl::live_rooms_locked() const {
  uint64_t n = prefill_ ? prefill_->live_rooms() : 0;
  for (const auto& [id, r] : rooms_)
    if (!r.initialized) ++n;
  for (const auto& [address, inst] : instances_) n += inst.ep->live_rooms();
  return n;
}

Status ManagerImpl::refuse_leaving(const char* what, uint64_t room) const {
  return {ErrorCode::kInvalidArgument,
          fmt::format("{}(room {}) on {}: this rank is leaving (Manager::leave() was called); no new rooms", what, room,
                      self().str())};
}

Status ManagerImpl::leave(int64_t timeout_ms) {
  std::unique_lock lock(mu_);
  if (!leaving_) {
    log_event(LogLevel::kInfo, "manager",
              fmt::format("{} leaving: no new rooms; {} rooms in flight go on", self().str(), live_rooms_locked()),
              {.extra = {{"event", "leaving"}}});
    leaving_ = true;
    if (prefill_) {  // metadata of rooms it will never have a sender for: answered
      std::set<uint64_t> coming;  // senders made, not init()ed yet: their metadata waits for them
      for (const auto& [id, r] : rooms_)
        if (!r.initialized) coming.insert(id);
      prefill_->leaving(std::move(coming));
    }
  }
  if (decoding_ || config_.bootstrap_address.empty() || deregister_started_) return Status::Ok();
  deregister_started_ = true;
  if (live_rooms_locked() == 0 && rooms_.empty()) {
    lock.unlock();
    return deregister(timeout_ms);
  }
  // Rooms in flight: the entry stays until they are done, so a decode rank that looks this
  // instance up for one of them (its receiver made after this call) still finds it.
  if (leaver_.joinable()) leaver_.join();  // an earlier removal that failed
  leaver_ = std::thread([this, timeout_ms] {
    for (;;) {
      {
        std::lock_guard l(mu_);
        if (stop_ || (live_rooms_locked() == 0 && rooms_.empty())) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    (void)deregister(timeout_ms);  // its outcome: a debug line, and drained()
  });
  return Status::Ok();
}

Status ManagerImpl::deregister(int64_t timeout_ms) {
  // Config, self and incarnation never change: read without the lock, which the DELETE does not hold.
  const RankId& me = self();
  BootstrapClient bootstrap(config_.bootstrap_address, static_cast<int>(std::max<int64_t>(1, timeout_ms / 3)));
  Status s = bootstrap.deregister(me.engine_id, me.dp_rank, me.tp_rank, core_->incarnation());
  if (!s.ok()) s = Status(s.code(), fmt::format("removing the bootstrap entry of {} at {}: {}", me.str(),
                                                config_.bootstrap_address, s.message()));
  log_event(LogLevel::kDebug, "manager",
            s.ok() ? fmt::format("{}: bootstrap entry at {} removed", me.str(), config_.bootstrap_address) : s.str());
  std::lock_guard lock(mu_);
  deregister_done_ = true;
  deregistered_ = s.ok();
  if (!s.ok()) deregister_started_ = false;  // a later leave() tries again
  return s;
}

bool ManagerImpl::drained() const {
  std::lock_guard lock(mu_);
  return leaving_ && rooms_.empty() && live_rooms_locked() == 0 && receivers_in_progress_ == 0 &&
         (decoding_ || config_.bootstrap_address.empty() || deregister_done_);
}

}  // namespace kvferry
