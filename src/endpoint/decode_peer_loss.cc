// DecodeEndpoint's side of losing a prefill rank (decode_endpoint.h): a death (no heartbeat,
// transport lost, a restart), a process known to be gone, and an orderly leave (the peer's
// leaving heartbeat, kvferry/messages.h Heartbeat::leaving). Each fails the rooms the rank feeds
// that are still in flight, with one line naming them.
#include <fmt/format.h>

#include <algorithm>

#include "endpoint/decode_endpoint.h"
#include "endpoint/room_list.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
}

// A prefill rank's orderly shutdown (its leaving heartbeat, at the incarnation known here): its
// loss, when the monitor or the transport reports it, is one info line if no room still in flight
// failed with it (docs/failure-model.md, "Leaving"). Nothing is cut off on its word: a peer
// without the secret could say it in another's name, and the peer's next heartbeat revokes it.
void DecodeEndpoint::on_leaving(const Heartbeat& hb) {
  if (!hb.leaving) {
    leaving_.erase(hb.sender);
    return;
  }
  if (peers_.count(hb.sender) && !dead_peers_.count(hb.sender)) leaving_.insert(hb.sender);
}

void DecodeEndpoint::on_peer_dead(const RankId& peer, const std::string& reason, bool gone) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  const bool left = leaving_.erase(peer) > 0;
  if (dead_peers_.count(peer)) {
    if (gone) source_restarted(peer);  // presumed dead before, now known to be gone
    return;
  }
  int64_t now = monotonic_ns();
  // The ranks of two prefill instances have the same RankId: the reason names the instance.
  const std::string instance =
      bootstrap_address_.empty() ? std::string() : fmt::format(" (prefill instance {})", bootstrap_address_);
  std::vector<uint64_t> failed;
  for (auto& [id, r] : rooms_) {
    bool fed = false;
    for (const RankId& s : r.sources) fed |= (s == peer);
    if (!fed) continue;
    // Only a process known to be gone writes nothing more; a silent one may still be writing
    // into these pages (a false death under load), so its rooms wait for its terminal status.
    if (gone) r.terminal.insert(peer);
    if (r.state.terminal()) {
      answer_sources(r, now);
      continue;
    }
    fail(id, ErrorCode::kPeerUnreachable, fmt::format("{} unreachable: {}{}", peer.str(), reason, instance), peer, now,
         false);
    failed.push_back(id);
  }
  it->second.dead_since_ns = now;
  std::sort(failed.begin(), failed.end());
  if (left && failed.empty()) {
    left_.insert(peer);  // departed(): its instance may be forgotten at once
    log_event(LogLevel::kInfo, kComp,
              fmt::format("prefill peer {}{} left (its manager closed); no room failed", peer.str(), instance),
              {.extra = {{"peer", peer.str()}, {"event", "peer_left"}}});
  } else {
    log_event(LogLevel::kError, kComp,
              fmt::format("prefill peer {}{} unreachable: {}; {} failed: {}", peer.str(), instance, reason,
                          failed.size() == 1 ? "1 room" : fmt::format("{} rooms", failed.size()), room_list(failed)),
              {.code = std::string(code_name(ErrorCode::kPeerUnreachable)), .origin = peer.str(),
               .extra = {{"peer", peer.str()}, {"event", "peer_dead"}}});
  }
  core_.control().forget(it->second.control_endpoint);
  dead_peers_.insert(peer);
  if (gone) source_gone(peer);  // a gone process writes nothing more into quarantined rooms either
  rediscover(peer, it->second.control_endpoint, it->second.incarnation);
}

void DecodeEndpoint::source_restarted(const RankId& src) {
  serving_.erase(src);  // a new process: its answer to our registration is a new one
  const int64_t now = monotonic_ns();
  for (auto& [id, r] : rooms_) {
    if (std::find(r.sources.begin(), r.sources.end(), src) == r.sources.end()) continue;
    if (!r.terminal.insert(src).second) continue;
    if (r.state.terminal()) answer_sources(r, now);
  }
  source_gone(src);
}

}  // namespace kvferry
