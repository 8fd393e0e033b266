// PrefillEndpoint: when a decode rank's restart is believed (prefill_endpoint.h; docs/security.md,
// "Incarnations"). Without the cluster secret anyone can send a registration in a decode rank's
// name with a newer incarnation: a claim. It is believed only once the endpoint the known
// incarnation registered says so: a challenge (a random nonce in a heartbeat, kvferry/messages.h)
// goes there, and only the process that owns that endpoint sees it. Its answer names its
// incarnation: the claimed one confirms the restart (a restarted rank took the endpoint over); the
// known one drops the claim (that rank lives). A claim naming another endpoint is also believed
// once the old endpoint is gone (old_endpoint_gone(): it refuses a connect). Silence proves
// nothing: a rank stopped or starved for a while answers late, and a claim waits for it.
#include <fmt/format.h>

#include <vector>

#include "endpoint/prefill_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.endpoint";
}  // namespace

bool PrefillEndpoint::restart_confirmed(const PoolRegistration& r, const PoolRegistration& old) {
  if (auto v = verified_owners_.find(r.sender); v != verified_owners_.end() && v->second == r.incarnation) return true;
  if (r.control_endpoint == old.control_endpoint) return false;  // only its answer settles that
  const int64_t now = monotonic_ns();
  const int64_t last = core_.monitor().last_heard_ns(r.sender);
  return old_endpoint_gone(old.control_endpoint, last == 0 ? 0 : now - last, restart_probes_, now);
}

void PrefillEndpoint::hold_restart_claim(const PoolRegistration& r, const std::string& old_endpoint, int64_t now_ns) {
  auto [it, fresh] = pending_restarts_.try_emplace(r.sender);  // keys: admitted identities (the plan)
  HeldRestart& h = it->second;
  if (!fresh && h.reg.incarnation > r.incarnation) return;  // a newer claim is held; its challenge stands
  if (fresh || h.reg.incarnation != r.incarnation || encode(Message{h.reg}) != encode(Message{r})) {
    h = HeldRestart{r, challenge_nonce(), 0};
  }
  if (h.challenged_ns != 0 && now_ns - h.challenged_ns < core_.config().deadlines.heartbeat_interval_ms * 1'000'000) return;
  h.challenged_ns = now_ns;
  Heartbeat challenge{core_.self(), 0, now_ns, core_.incarnation()};
  challenge.challenge = h.nonce;
  Status s = core_.send(old_endpoint, challenge);
  if (!s.ok()) log_event(LogLevel::kDebug, kComp, fmt::format("challenge to {} not sent: {}", old_endpoint, s.str()));
}

void PrefillEndpoint::answer_challenge(const Heartbeat& hb) {
  const std::string* endpoint = control_endpoint_of(hb.sender);  // never one a frame names
  if (!endpoint || !challenge_answers_.take(monotonic_ns())) return;
  Heartbeat answer{core_.self(), 0, monotonic_ns(), core_.incarnation()};
  answer.answer = hb.challenge;
  (void)core_.send(*endpoint, answer);
}

void PrefillEndpoint::on_challenge_answer(const Heartbeat& hb) {
  if (proven_alive(core_, revivals_, hb, known_incarnation(hb.sender))) return;
  auto it = pending_restarts_.find(hb.sender);
  if (it == pending_restarts_.end() || it->second.nonce != hb.answer) {
    core_.refuse(Refusal::kUnconfirmedRestart, hb.sender,
                 fmt::format("answer of {} to no challenge of this rank dropped", hb.sender.str()), /*quiet=*/true);
    return;
  }
  const uint64_t known = known_incarnation(hb.sender);
  const std::string* endpoint = control_endpoint_of(hb.sender);
  const std::string where = endpoint ? *endpoint : "its endpoint";
  const uint64_t claimed = it->second.reg.incarnation;
  if (hb.incarnation <= known) {  // the known incarnation still owns its endpoint: it lives
    pending_restarts_.erase(it);
    if (hb.incarnation == known) core_.monitor().heard(hb.sender, monotonic_ns(), /*proven=*/true);
    core_.refuse(Refusal::kUnconfirmedRestart, hb.sender,
                 fmt::format("restart claim of {} as incarnation {} refused: incarnation {} answered at {}",
                             hb.sender.str(), claimed, hb.incarnation, where));
    return;
  }
  // A newer incarnation owns the old endpoint: it restarted. Its own registration is believed.
  verified_owners_[hb.sender] = hb.incarnation;
  if (claimed != hb.incarnation) {
    pending_restarts_.erase(it);  // not the owner's claim: the owner registers again with its answer
    log_event(LogLevel::kDebug, kComp,
              fmt::format("restart claim of {} as incarnation {} dropped: incarnation {} answered at {}",
                          hb.sender.str(), claimed, hb.incarnation, where));
    return;
  }
  const PoolRegistration held = std::move(it->second.reg);
  pending_restarts_.erase(it);
  log_event(LogLevel::kDebug, kComp,
            fmt::format("restart of {} as incarnation {} confirmed at {}", hb.sender.str(), claimed, where));
  on_registration(held);
}

void PrefillEndpoint::judge_restart_claims(int64_t now_ns) {
  std::vector<PoolRegistration> taken;
  for (auto it = pending_restarts_.begin(); it != pending_restarts_.end();) {
    const RankId peer = it->first;
    const PoolRegistration* was = registration_for(peer);
    if (!was) was = dead_regs_.count(peer) ? &dead_regs_.at(peer) : nullptr;
    if (it->second.reg.incarnation <= known_incarnation(peer)) {
      it = pending_restarts_.erase(it);  // that incarnation (or a newer one) registered since
      continue;
    }
    if (was && !restart_confirmed(it->second.reg, *was)) {
      hold_restart_claim(it->second.reg, was->control_endpoint, now_ns);  // challenged again, once per interval
      ++it;
      continue;
    }
    if (was) verified_owners_[peer] = it->second.reg.incarnation;  // its old endpoint is gone
    taken.push_back(std::move(it->second.reg));
    it = pending_restarts_.erase(it);
  }
  for (const PoolRegistration& r : taken) on_registration(r);
}

}  // namespace kvferry
