// PrefillEndpoint's decode instances (prefill_endpoint.h; docs/manager.md "Several decode
// instances"): one prefill rank serving the ranks of several decode engines (1PxD).
//
// A decode instance is its ranks' engine_id (ManagerConfig::self.engine_id; the adapters derive
// one per instance, docs/vllm.md, docs/sglang.md). Every rank of every instance is its own peer,
// keyed by its whole RankId in every per-peer map (registration, incarnation, connect, link,
// monitor, restart claims, refusals), so two instances' tp0 are two peers. A room is bound to the
// instance whose metadata (or renewal) it accepted first; its destinations are that instance's
// ranks, its statuses go to them only, and another instance's frames for it are refused
// (from_destination, foreign_messages) and change nothing. The instances known are bounded
// (max_decode_instances); one with no room, no rank connected (its ranks were declared dead or
// never connected) and no frame for decode_instance_idle_ms is forgotten, so a removed or
// restarted instance does not keep its slot.
#include <fmt/format.h>

#include <algorithm>

#include "endpoint/prefill_endpoint.h"
#include "kvferry/log.h"
#include "kvferry/routing.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.endpoint";
}  // namespace

std::optional<uint32_t> PrefillEndpoint::bound_engine(uint64_t room) const {
  if (auto it = rooms_.find(room); it != rooms_.end()) return it->second.engine;
  if (auto t = tombstones_.find(room); t != tombstones_.end()) return t->second.engine;
  if (auto pm = pending_meta_.find(room); pm != pending_meta_.end() && !pm->second.empty())
    return pm->second.front().second.sender.engine_id;
  return std::nullopt;
}

bool PrefillEndpoint::known_instance(uint32_t engine) const {
  if (instances_.count(engine)) return true;
  auto it = refused_.lower_bound(RankId{Role::kDecode, engine, 0, 0});  // a rank of it refused (its record)
  return it != refused_.end() && it->first.role == Role::kDecode && it->first.engine_id == engine;
}

std::optional<uint32_t> PrefillEndpoint::sole_instance() const {
  if (instances_.size() > 1) return std::nullopt;
  std::optional<uint32_t> one;
  if (!instances_.empty()) one = instances_.begin()->first;
  // The instances whose ranks were refused count too (their rooms fail with the refusal's record):
  // one step per distinct engine_id in refused_ (ordered by role, then engine_id).
  for (auto it = refused_.lower_bound(RankId{Role::kDecode, 0, 0, 0});
       it != refused_.end() && it->first.role == Role::kDecode;) {
    const uint32_t e = it->first.engine_id;
    if (one && *one != e) return std::nullopt;
    one = e;
    if (e == UINT32_MAX) break;
    it = refused_.lower_bound(RankId{Role::kDecode, e + 1, 0, 0});
  }
  return one;
}

std::optional<uint32_t> PrefillEndpoint::presumed_engine(uint64_t room) const {
  if (std::optional<uint32_t> e = bound_engine(room)) return e;
  return sole_instance();
}

std::vector<RankId> PrefillEndpoint::dests_for(uint64_t room, uint32_t engine) const {
  std::vector<RankId> out;
  for (uint32_t d : dests_of(plan_, core_.self().tp_rank))
    out.push_back({Role::kDecode, engine, d, dp_rank_for_room(room, decode_dp_)});
  return out;
}

std::vector<RankId> PrefillEndpoint::dests_or_presumed(const SenderRoom& r) const {
  if (!r.planned || r.engine) return r.dests;
  if (std::optional<uint32_t> e = sole_instance()) return dests_for(r.room, *e);
  return {};
}

std::vector<RankId> PrefillEndpoint::destinations(uint64_t room) const {
  if (auto it = rooms_.find(room); it != rooms_.end()) return dests_or_presumed(it->second);
  if (std::optional<uint32_t> e = presumed_engine(room)) return dests_for(room, *e);
  return {};
}

bool PrefillEndpoint::bind(SenderRoom& r, uint32_t engine) {
  r.engine = engine;
  r.dests = dests_for(r.room, engine);
  log_event(LogLevel::kDebug, kComp, fmt::format("bound to decode instance {}", engine), {.room = r.room});
  if (r.state.terminal()) return true;
  for (const RankId& dst : r.dests) {
    if (dead_peers_.count(dst)) {
      fail(r.room, ErrorCode::kPeerUnreachable, fmt::format("{} is down", dst.str()), dst, monotonic_ns(), false);
      return false;
    }
  }
  return !fail_if_incompatible(r.room);
}

bool PrefillEndpoint::admit_instance(const PoolRegistration& r, int64_t now_ns) {
  const uint32_t engine = r.sender.engine_id;
  if (auto it = instances_.find(engine); it != instances_.end()) {
    it->second.last_ns = now_ns;
    return true;
  }
  const uint32_t max = core_.config().max_decode_instances;
  if (instances_.size() < max) return true;  // added once the registration is accepted
  const std::string why = fmt::format(
      "this rank serves {} decode instances already (max_decode_instances {}); an instance is forgotten {} ms after "
      "its last room and frame",
      instances_.size(), max, core_.config().decode_instance_idle_ms);
  core_.refuse(Refusal::kTooManyPeers, r.sender,
               fmt::format("pool registration of {} (decode instance {}) refused: {}", r.sender.str(), engine, why));
  // Told (rate-limited) without keeping anything: no refusal record, no "told" mark.
  if (refusal_answers_.take(now_ns)) {
    Failure f{ErrorCode::kResourceExhausted, core_.self(),
              fmt::format("pool registration of {} refused by {}: {}", r.sender.str(), core_.self().str(), why), now_ns,
              wall_from_monotonic(now_ns)};
    RegistrationRefusal refusal{core_.self(), f};
    refusal.peer_incarnation = r.incarnation;
    (void)core_.send(r.control_endpoint, refusal);
  }
  return false;
}

void PrefillEndpoint::touch_instance(const RankId& sender, int64_t now_ns) {
  if (auto it = instances_.find(sender.engine_id); it != instances_.end()) it->second.last_ns = now_ns;
}

void PrefillEndpoint::forget_idle_instances(int64_t now_ns) {
  const int64_t idle_ns = core_.config().decode_instance_idle_ms * 1'000'000;
  // An instance whose ranks known here all left in order (each said it was leaving, then was lost
  // with no room failed; never on its word alone) goes at once; any other after decode_instance_idle_ms.
  auto left = [&](uint32_t e) {
    bool any = false;
    for (const auto& [rank, reg] : dead_regs_) {
      if (rank.engine_id != e) continue;
      if (!left_.count(rank)) return false;
      any = true;
    }
    return any;
  };
  std::vector<uint32_t> idle;
  for (const auto& [engine, inst] : instances_)
    if (now_ns - inst.last_ns > idle_ns || (!left_.empty() && left(engine))) idle.push_back(engine);
  if (idle.empty()) return;
  auto busy = [&](uint32_t e) {
    for (const auto& [id, r] : rooms_)
      if (r.engine == e) return true;
    for (const auto& [id, a] : abandoned_)  // its pages may still be written
      for (const RankId& d : a.dests)
        if (d.engine_id == e) return true;
    for (const auto& [rank, c] : connecting_)
      if (rank.engine_id == e) return true;
    for (const auto& [rank, p] : peers_)  // connected and not declared dead: it lives
      if (rank.engine_id == e) return true;
    return false;
  };
  for (uint32_t e : idle) {
    if (busy(e)) continue;
    forget_instance(e);
    ++forgotten_instances_;
    log_event(LogLevel::kDebug, kComp,
              left(e) ? fmt::format("decode instance {} forgotten: its ranks left", e)
                      : fmt::format("decode instance {} forgotten: no room and no frame for {} ms", e,
                                    core_.config().decode_instance_idle_ms));
  }
}

void PrefillEndpoint::forget_instance(uint32_t engine) {
  instances_.erase(engine);
  auto of = [engine](const RankId& r) { return r.engine_id == engine; };
  std::vector<RankId> ranks;
  for (const auto& [rank, p] : peers_)
    if (of(rank)) ranks.push_back(rank);
  for (const auto& [rank, reg] : dead_regs_)
    if (of(rank)) ranks.push_back(rank);
  for (const RankId& rank : ranks) {
    if (auto p = peers_.find(rank); p != peers_.end()) {
      core_.transport().disconnect(p->second.peer);
      core_.control().forget(p->second.reg.control_endpoint);
      peers_.erase(p);
    }
    if (auto d = dead_regs_.find(rank); d != dead_regs_.end()) {
      core_.control().forget(d->second.control_endpoint);
      dead_regs_.erase(d);
    }
    core_.monitor().unwatch(rank);
    revivals_.forget(rank);
  }
  std::erase_if(dead_peers_, of);
  std::erase_if(incarnations_, [&](const auto& kv) { return of(kv.first); });
  std::erase_if(pending_restarts_, [&](const auto& kv) { return of(kv.first); });
  std::erase_if(verified_owners_, [&](const auto& kv) { return of(kv.first); });
  std::erase_if(suspect_links_, [&](const auto& kv) { return of(kv.first); });
  std::erase_if(refused_, [&](const auto& kv) { return of(kv.first); });
  std::erase_if(told_refusal_, of);
  std::erase_if(leaving_, of);
  std::erase_if(left_, of);
}

}  // namespace kvferry
