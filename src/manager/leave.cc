// Manager::leave() and drained() (kvferry/manager.h; docs/failure-model.md "Leaving"): the first
// half of an orderly leave. No new rooms; the rooms handed out go on; a prefill rank removes its
// bootstrap entry (DELETE /route at its incarnation, include/kvferry/bootstrap.h) so that decode
// ranks looking the instance up from now on are told it left instead of waiting for it. The second
// half is the destructor's leaving heartbeat (endpoint/peer_monitor.cc).
#include <fmt/format.h>

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
  {
    std::lock_guard lock(mu_);
    if (!leaving_)
      log_event(LogLevel::kInfo, "manager",
                fmt::format("{} leaving: no new rooms; {} rooms in flight go on", self().str(), live_rooms_locked()),
                {.extra = {{"event", "leaving"}}});
    leaving_ = true;
    if (deregistered_) return Status::Ok();
  }
  // Config, self and incarnation never change: read without the lock, which the DELETE does not hold.
  if (decoding_ || config_.bootstrap_address.empty()) return Status::Ok();
  const RankId& me = self();
  BootstrapClient bootstrap(config_.bootstrap_address, static_cast<int>(std::max<int64_t>(1, timeout_ms / 3)));
  Status s = bootstrap.deregister(me.engine_id, me.dp_rank, me.tp_rank, core_->incarnation());
  if (!s.ok())
    return Status(s.code(), fmt::format("removing the bootstrap entry of {} at {}: {}", me.str(),
                                        config_.bootstrap_address, s.message()));
  log_event(LogLevel::kDebug, "manager",
            fmt::format("{}: bootstrap entry at {} removed", me.str(), config_.bootstrap_address));
  std::lock_guard lock(mu_);
  deregistered_ = true;
  return Status::Ok();
}

bool ManagerImpl::drained() const {
  std::lock_guard lock(mu_);
  return leaving_ && rooms_.empty() && live_rooms_locked() == 0;
}

}  // namespace kvferry
