// A decode manager's prefill instances (kvferry/manager.h receiver(); docs/manager.md "Several
// prefill instances"): one DecodeEndpoint per instance, by bootstrap address, over the manager's
// one core (control socket, transport, registered memory, failure registry, room fence).
//
// The ranks of two prefill instances have the same RankIds (every prefill engine is engine 0 in
// its own plan), so what is kept per source is kept per instance: each endpoint has its sources,
// their incarnations, deaths, restarts, quarantined rooms and compatibility records, and watches
// them with a PeerMonitor of its own. A frame is handed to the one instance it belongs to
// (dispatch_decode): a status to the instance of its room; any other frame to the instance whose
// source of that RankId has the frame's incarnation (incarnations are unique per process,
// kvferry/messages.h); a frame no instance knows at its incarnation (a restart claim, a stale
// frame, the answer to a challenge naming the claimed incarnation) to every instance with that
// source, which judges it by the incarnation it knows, as a lone endpoint does.
//
// Facts copied from SGLang (python/sglang/srt/disaggregation/common/conn.py, CommonKVReceiver
// __init__ and init; mooncake/conn.py's decode KVManager): the decode manager keeps the prefill
// instance's parallel info per bootstrap address (prefill_info_table, filled by
// ensure_parallel_info on the first receiver naming a new address) and its connections per
// address and rank; a lookup that fails fails that receiver's room only; rooms are tracked per
// address (addr_to_rooms_tracker) so that a dead instance fails its own rooms.
#include <fmt/format.h>

#include <utility>

#include "kvferry/bootstrap.h"
#include "kvferry/log.h"
#include "manager/manager_internal.h"

namespace kvferry {

DecodeEndpoint* ManagerImpl::decode() {
  if (!decoding_ || instances_.empty()) return nullptr;
  auto it = instances_.find(config_.bootstrap_address);
  return (it != instances_.end() ? it : instances_.begin())->second.ep.get();
}

Result<DecodeEndpoint*> ManagerImpl::prefill_instance(const std::string& address,
                                                      std::unique_lock<std::recursive_mutex>& lock) {
  for (;;) {
    if (auto it = instances_.find(address); it != instances_.end()) return it->second.ep.get();
    auto in_flight = lookups_.find(address);
    if (in_flight == lookups_.end()) break;
    // One lookup per address: wait for its answer (the lock is released meanwhile).
    std::shared_ptr<Lookup> theirs = in_flight->second;
    lookup_done_.wait(lock, [&] { return theirs->done; });
    if (!theirs->status.ok()) return theirs->status;
    // Found: it is in instances_ now (unless forgotten since, then looked up again).
  }
  if (instances_.size() + lookups_.size() >= config_.max_prefill_instances)
    return Status(ErrorCode::kResourceExhausted,
                  fmt::format("prefill instance at {}: this decode rank already serves {} prefill instances "
                              "(max_prefill_instances {}); an instance is forgotten {} ms after its last room",
                              address, instances_.size() + lookups_.size(), config_.max_prefill_instances,
                              config_.prefill_instance_idle_ms));
  auto mine = std::make_shared<Lookup>();
  lookups_[address] = mine;
  const uint32_t tp_rank = self().tp_rank;
  const int64_t deadline = monotonic_ns() + config_.deadlines.lookup_timeout_ms * 1'000'000;
  lock.unlock();  // the other instances' rooms go on while this one is looked up
  Result<std::vector<PrefillRankInfo>> entries = [&] {
    BootstrapClient bootstrap(address, 2000);
    return DecodeEndpoint::look_up_sources(plan_, tp_rank, config_.peer_dp_size, bootstrap, deadline);
  }();
  lock.lock();
  Status s = entries.status();
  DecodeEndpoint* found = nullptr;
  if (s.ok()) {
    // The core's monitor watches one instance's sources (the first, usually the configured one);
    // every other instance has its own.
    bool core_monitor_free = true;
    for (const auto& [other, inst] : instances_) core_monitor_free &= !inst.core_monitor;
    auto ep = std::make_unique<DecodeEndpoint>(*core_, plan_, address, config_.peer_dp_size,
                                               DecodeEndpoint::Sharing{fence_, !core_monitor_free});
    s = ep->adopt_sources(*entries);
    if (s.ok()) {
      found = ep.get();
      PrefillInstance& inst = instances_[address];
      inst.ep = std::move(ep);
      inst.core_monitor = core_monitor_free;
      inst.idle_since_ns = monotonic_ns();
      log_event(LogLevel::kDebug, "manager",
                fmt::format("prefill instance at {}: {} source ranks registered with ({} instances served)", address,
                            entries->size(), instances_.size()));
    } else {
      ep->forget_sources();
    }
  }
  if (!s.ok()) s = Status(s.code(), "prefill instance at " + address + ": " + s.message());
  mine->done = true;
  mine->status = s;
  lookups_.erase(address);
  lookup_done_.notify_all();
  if (!s.ok()) return s;
  return found;
}

bool ManagerImpl::decode_admits(const RankId& sender) {
  // The plan is the same for every instance: the first one's check counts a refusal once.
  if (!instances_.empty()) return instances_.begin()->second.ep->admits(sender);
  core_->peer_debug("manager", fmt::format("frame from {} ignored: no prefill instance is served", sender.str()));
  return false;
}

void ManagerImpl::dispatch_decode(const Message& m) {
  if (const auto* st = std::get_if<RoomStatus>(&m)) {
    if (DecodeEndpoint* ep = decode_of(st->room)) return ep->on_message(m);
    for (auto& [address, inst] : instances_)  // a released room still quarantined there
      if (inst.ep->has_room(st->room) || inst.ep->is_quarantined(st->room)) return inst.ep->on_message(m);
  }
  const RankId sender = std::visit([](const auto& x) { return x.sender; }, m);
  const uint64_t incarnation = std::visit([](const auto& x) { return x.incarnation; }, m);
  for (auto& [address, inst] : instances_)
    if (inst.ep->known_incarnation(sender) == incarnation) return inst.ep->on_message(m);
  bool any = false;
  for (auto& [address, inst] : instances_)
    if (inst.ep->known_incarnation(sender)) {
      inst.ep->on_message(m);
      any = true;
    }
  if (!any)
    core_->peer_debug("manager", fmt::format("{} frame from {} ignored: no prefill instance served has that source",
                                             message_name(m), sender.str()));
}

void ManagerImpl::tick_instances(int64_t now) {
  for (auto it = instances_.begin(); it != instances_.end();) {
    PrefillInstance& inst = it->second;
    inst.ep->tick(now);
    const bool pinned = it->first == config_.bootstrap_address;
    // An instance whose every source left in order (DecodeEndpoint::departed()) goes at once.
    const bool left = inst.ep->departed();
    if (!pinned && inst.rooms == 0 && inst.idle_since_ns != 0 && inst.ep->idle() &&
        (left || now - inst.idle_since_ns > config_.prefill_instance_idle_ms * 1'000'000)) {
      log_event(LogLevel::kDebug, "manager",
                left ? fmt::format("prefill instance at {} forgotten: its ranks left", it->first)
                     : fmt::format("prefill instance at {} forgotten: no room for {} ms", it->first,
                                   config_.prefill_instance_idle_ms));
      forgotten_reclaimed_ += inst.ep->reclaimed_total();
      forgotten_heartbeats_ += inst.ep->own_monitor_stats().heartbeats_sent;  // a counter never goes back
      ++forgotten_instances_;
      inst.ep->forget_sources();
      it = instances_.erase(it);
      continue;
    }
    ++it;
  }
}

void ManagerImpl::room_left(const std::string& instance, int64_t now) {
  auto it = instances_.find(instance);
  if (it == instances_.end() || it->second.rooms == 0) return;
  if (--it->second.rooms == 0) it->second.idle_since_ns = now;
}

}  // namespace kvferry
