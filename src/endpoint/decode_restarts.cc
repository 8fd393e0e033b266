// DecodeEndpoint: which incarnation of a prefill source is believed (decode_endpoint.h;
// docs/failure-model.md "Incarnations", docs/security.md "Checked without the secret"). Without
// the cluster secret anyone can send a frame in a source's name, so a frame naming a newer
// incarnation is only a claim: held, and believed once the source's known control endpoint says
// so (it answers a challenge with that incarnation) or is gone (declared dead and refusing
// connects). A claim changes nothing else: the live source keeps its rooms and its frames stay
// accepted; an answer of the known incarnation drops the claim.
#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "endpoint/decode_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
}  // namespace

bool DecodeEndpoint::accept_incarnation(const RankId& sender, uint64_t inc, uint64_t peer_inc,
                                        std::string_view kind) {
  if (peer_inc != 0 && peer_inc != core_.incarnation()) {
    core_.refuse_stale(kind, sender,
                       fmt::format("meant for incarnation {} of this rank, which is {}", peer_inc, core_.incarnation()));
    return false;
  }
  auto it = peers_.find(sender);
  if (it == peers_.end() || it->second.incarnation == 0 || inc == 0 || inc == it->second.incarnation) return true;
  const uint64_t known = it->second.incarnation;
  if (inc < known) {
    core_.refuse_stale(kind, sender, fmt::format("from its incarnation {}, older than {}", inc, known));
    // Its endpoint's owner says which incarnation it is (on_ownership_answer()).
    ownership_checks_.send(core_, sender, it->second.control_endpoint, monotonic_ns());
    return false;
  }
  const int64_t wall = realtime_ns();
  if (inc > static_cast<uint64_t>(wall) + kMaxIncarnationSkewNs) {
    core_.refuse(Refusal::kFutureIncarnation, sender,
                 fmt::format("{} from {} refused: incarnation {} is more than {} s ahead of this rank's clock ({})",
                             kind, sender.str(), inc, kMaxIncarnationSkewNs / 1'000'000'000, wall));
    return false;
  }
  RestartClaim& claim = restart_claims_[sender];
  if (inc > claim.incarnation) claim.incarnation = inc;
  if (claim.nonce == 0) claim.nonce = challenge_nonce();
  core_.refuse(Refusal::kUnconfirmedRestart, sender,
               fmt::format("{} from {} held: incarnation {} is newer than {}; believed once {} is gone", kind,
                           sender.str(), inc, known, known),
               /*quiet=*/true);
  return false;
}

void DecodeEndpoint::judge_restart_claims(int64_t now_ns) {
  const int64_t interval_ns = core_.config().deadlines.heartbeat_interval_ms * 1'000'000;
  std::vector<std::pair<RankId, uint64_t>> believed;
  for (auto it = restart_claims_.begin(); it != restart_claims_.end();) {
    const RankId peer = it->first;
    RestartClaim& claim = it->second;
    auto known = peers_.find(peer);
    if (known == peers_.end() || known->second.incarnation == 0 || claim.incarnation <= known->second.incarnation) {
      it = restart_claims_.erase(it);  // registered with that incarnation (or a newer one) since
      continue;
    }
    const std::string& endpoint = known->second.control_endpoint;
    const int64_t last = monitor().last_heard_ns(peer);
    if (dead_peers_.count(peer) && old_endpoint_gone(endpoint, last == 0 ? 0 : now_ns - last, restart_probes_, now_ns)) {
      believed.emplace_back(peer, claim.incarnation);
      it = restart_claims_.erase(it);
      continue;
    }
    if (claim.challenged_ns == 0 || now_ns - claim.challenged_ns >= interval_ns) {
      claim.challenged_ns = now_ns;
      Heartbeat challenge{core_.self(), 0, now_ns, core_.incarnation()};
      challenge.challenge = claim.nonce;
      (void)core_.send(endpoint, challenge);
    }
    ++it;
  }
  for (const auto& [peer, inc] : believed) believe_restart(peer, inc);
}

void DecodeEndpoint::believe_restart(const RankId& peer, uint64_t inc) {
  auto known = peers_.find(peer);
  if (known == peers_.end()) return;
  const uint64_t old = known->second.incarnation;
  core_.count_peer_restart();
  on_peer_dead(peer, fmt::format("restarted (incarnation {} -> {})", old, inc), /*gone=*/true);
}

void DecodeEndpoint::answer_challenge(const Heartbeat& hb) {
  auto it = peers_.find(hb.sender);  // its known endpoint, never one a frame names
  if (it == peers_.end() || !challenge_answers_.take(monotonic_ns())) return;
  Heartbeat answer{core_.self(), 0, monotonic_ns(), core_.incarnation()};
  answer.answer = hb.challenge;
  (void)core_.send(it->second.control_endpoint, answer);
  (void)send_registration(hb.sender, it->second.control_endpoint, it->second.incarnation);
}

void DecodeEndpoint::on_challenge_answer(const Heartbeat& hb) {
  auto known = peers_.find(hb.sender);
  if (known != peers_.end() && proven_alive(core_, monitor(), revivals_, hb, known->second.incarnation)) return;
  if (known != peers_.end() && on_ownership_answer(hb, known->second.incarnation)) return;
  auto it = restart_claims_.find(hb.sender);
  if (it == restart_claims_.end() || it->second.nonce != hb.answer || known == peers_.end()) {
    core_.refuse(Refusal::kUnconfirmedRestart, hb.sender,
                 fmt::format("answer of {} to no challenge of this rank dropped", hb.sender.str()), /*quiet=*/true);
    return;
  }
  const uint64_t claimed = it->second.incarnation;
  const uint64_t inc = known->second.incarnation;
  restart_claims_.erase(it);
  if (hb.incarnation <= inc) {  // the known incarnation still owns its endpoint: it lives
    if (hb.incarnation == inc) monitor().heard(hb.sender, monotonic_ns(), /*proven=*/true);
    core_.refuse(Refusal::kUnconfirmedRestart, hb.sender,
                 fmt::format("restart claim of {} as incarnation {} refused: incarnation {} answered at {}",
                             hb.sender.str(), claimed, hb.incarnation, known->second.control_endpoint));
    return;
  }
  believe_restart(hb.sender, hb.incarnation);  // a newer incarnation owns the endpoint: it restarted
}


bool DecodeEndpoint::on_ownership_answer(const Heartbeat& hb, uint64_t known) {
  if (!ownership_checks_.answered(hb)) return false;
  if (hb.incarnation < known) adopt_incarnation(hb.sender, hb.incarnation);  // the known one is not its
  return true;
}

void DecodeEndpoint::adopt_incarnation(const RankId& peer, uint64_t inc) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  const std::string endpoint = it->second.control_endpoint;
  log_event(LogLevel::kWarning, kComp,
            fmt::format("{} at {} is incarnation {}, not {} (the incarnation this rank was given, e.g. by its bootstrap "
                        "entry): registering again with {}",
                        peer.str(), endpoint, inc, it->second.incarnation, inc));
  restart_claims_.erase(peer);
  if (!send_registration(peer, endpoint, inc).ok()) return;
  // Metadata sent under the other incarnation was refused there: the rooms still waiting send it again.
  for (auto& [id, r] : rooms_)
    if (!r.state.terminal() && r.metadata_sent.count(peer) && !r.terminal.count(peer)) (void)send_metadata(r, peer, endpoint);
}

}  // namespace kvferry
