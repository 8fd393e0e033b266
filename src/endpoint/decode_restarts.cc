// DecodeEndpoint: which incarnation of a prefill source is believed (decode_endpoint.h;
// docs/failure-model.md "Incarnations", docs/security.md "Checked without the secret"). Without
// the cluster secret anyone can send a frame in a source's name, so a frame naming a newer
// incarnation is only a claim: held, and believed once the incarnation known here is gone. A
// claim changes nothing else: the live source keeps its rooms and its frames stay accepted.
#include <fmt/format.h>

#include <algorithm>

#include "endpoint/decode_endpoint.h"

namespace kvferry {

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
    return false;
  }
  const int64_t wall = realtime_ns();
  if (inc > static_cast<uint64_t>(wall) + kMaxIncarnationSkewNs) {
    core_.refuse(Refusal::kFutureIncarnation, sender,
                 fmt::format("{} from {} refused: incarnation {} is more than {} s ahead of this rank's clock ({})",
                             kind, sender.str(), inc, kMaxIncarnationSkewNs / 1'000'000'000, wall));
    return false;
  }
  uint64_t& claim = restart_claims_[sender];
  claim = std::max(claim, inc);
  core_.refuse(Refusal::kUnconfirmedRestart, sender,
               fmt::format("{} from {} held: incarnation {} is newer than {}; believed once {} is gone", kind,
                           sender.str(), inc, known, known),
               /*quiet=*/true);
  return false;
}

void DecodeEndpoint::judge_restart_claims(int64_t now_ns) {
  const Deadlines& d = core_.config().deadlines;
  const int64_t silence_ns = std::max(3 * d.heartbeat_interval_ms, d.heartbeat_timeout_ms / 2) * 1'000'000;
  for (auto it = restart_claims_.begin(); it != restart_claims_.end();) {
    const RankId peer = it->first;
    const uint64_t inc = it->second;
    auto known = peers_.find(peer);
    if (known == peers_.end() || known->second.incarnation == 0 || inc <= known->second.incarnation) {
      it = restart_claims_.erase(it);  // registered with that incarnation (or a newer one) since
      continue;
    }
    // Gone: declared dead here, or silent. One process only owns the old incarnation's control
    // endpoint; if it still ran, its heartbeats would still come every interval.
    const int64_t last = core_.monitor().last_heard_ns(peer);
    if (!dead_peers_.count(peer) && (last == 0 || now_ns - last < silence_ns)) {
      ++it;
      continue;
    }
    const uint64_t old = known->second.incarnation;
    it = restart_claims_.erase(it);
    core_.count_peer_restart();
    on_peer_dead(peer, fmt::format("restarted (incarnation {} -> {})", old, inc), /*gone=*/true);
  }
}

}  // namespace kvferry
