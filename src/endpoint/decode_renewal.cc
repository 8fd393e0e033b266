// DecodeEndpoint: the lease renewal (decode_endpoint.h renew; docs/manager.md "Renewal").
//
// A room add_room()ed (the engine's Receiver::init: the sources are known) whose metadata has not
// gone out yet (the engine has no pages for it yet: vLLM's request waits for blocks) would fail
// at its sources when their bootstrap deadline passes. While this rank is alive it renews the
// room there: every renew_interval, each live source gets one Heartbeat (more if it feeds over
// kMaxRenewRooms such rooms) naming them; the source moves their deadline to its bootstrap_timeout
// from now, up to its renew_limit (prefill_renewal.cc). Sent from this main thread, so a wedged
// rank stops renewing; a dead one too, and the lease ends at the source as it did without renewal.
// Nothing here grows with what a peer sends: the lists are built from this rank's own rooms.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "endpoint/decode_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
}  // namespace

void DecodeEndpoint::renew(int64_t now_ns) {
  if (now_ns < next_renew_ns_) return;
  next_renew_ns_ = now_ns + core_.config().deadlines.renew_interval_ms * 1'000'000;
  std::map<RankId, std::vector<uint64_t>> awaited;
  for (const auto& [id, r] : rooms_) {
    if (r.init_called || r.state.get() != KVPoll::Bootstrapping) continue;
    for (const RankId& src : r.sources)
      if (!dead_peers_.count(src)) awaited[src].push_back(id);
  }
  for (auto& [src, rooms] : awaited) {
    auto peer = peers_.find(src);
    if (peer == peers_.end()) continue;
    for (size_t at = 0; at < rooms.size(); at += kMaxRenewRooms) {
      Heartbeat hb{core_.self(), 0, now_ns, core_.incarnation()};
      const size_t n = std::min<size_t>(kMaxRenewRooms, rooms.size() - at);
      hb.renew_rooms.assign(rooms.begin() + static_cast<std::ptrdiff_t>(at),
                            rooms.begin() + static_cast<std::ptrdiff_t>(at + n));
      Status s = core_.send(peer->second.control_endpoint, hb);
      if (!s.ok()) {
        log_event(LogLevel::kDebug, kComp, fmt::format("renewal to {} not delivered: {}", src.str(), s.str()));
        break;
      }
      ++renewals_sent_;
    }
  }
}

}  // namespace kvferry
