// PrefillEndpoint: a transport endpoint failure is a suspicion, judged by the peer's control
// endpoint (docs/failure-model.md, "A transport error is only a suspicion").
#include <fmt/format.h>

#include <vector>

#include "endpoint/peer_monitor.h"
#include "endpoint/prefill_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {

namespace {
constexpr const char* kComp = "prefill";
constexpr int kProbeBudgetMs = 20;  // as PeerMonitor's own probes
}  // namespace

void PrefillEndpoint::on_transport_lost(const RankId& peer, const std::string& reason, int64_t now_ns) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  auto s = suspect_links_.find(peer);
  if (s != suspect_links_.end() && s->second.peer == it->second.peer) return;  // judged already
  const PeerMonitor::Probe probe = PeerMonitor::probe(it->second.reg.control_endpoint, kProbeBudgetMs);
  if (probe != PeerMonitor::Probe::kAccepts) {  // gone (refused), or the network is silent
    on_peer_dead(peer, "transport: " + reason);
    return;
  }
  suspect_links_[peer] = {it->second.peer, reason, now_ns + kLinkVerdictMs * 1'000'000, now_ns};
  log_event(LogLevel::kDebug, kComp,
            fmt::format("transport endpoint to {} failed ({}), its control endpoint accepts: judging for {} ms",
                        peer.str(), reason, kLinkVerdictMs));
}

bool PrefillEndpoint::awaits_link_verdict(PeerId pid) const {
  for (const auto& [rank, s] : suspect_links_)
    if (s.peer == pid) return true;
  return false;
}

void PrefillEndpoint::judge_suspect_links(int64_t now_ns) {
  struct Verdict {
    RankId peer;
    std::string reason;
    bool dead;
  };
  std::vector<Verdict> verdicts;
  for (auto it = suspect_links_.begin(); it != suspect_links_.end();) {
    auto p = peers_.find(it->first);
    if (p == peers_.end() || p->second.peer != it->second.peer) {  // dead, or connected anew
      it = suspect_links_.erase(it);
      continue;
    }
    SuspectLink& s = it->second;
    if (now_ns - s.probed_ns >= PeerMonitor::kProbeIntervalMs * 1'000'000) {
      s.probed_ns = now_ns;
      if (PeerMonitor::probe(p->second.reg.control_endpoint, kProbeBudgetMs) != PeerMonitor::Probe::kAccepts) {
        verdicts.push_back({it->first, s.reason, true});
        it = suspect_links_.erase(it);
        continue;
      }
    }
    if (now_ns >= s.deadline_ns) {
      verdicts.push_back({it->first, s.reason, false});
      it = suspect_links_.erase(it);
      continue;
    }
    ++it;
  }
  for (const Verdict& v : verdicts) {
    if (v.dead) on_peer_dead(v.peer, "transport: " + v.reason);
    else on_link_lost(v.peer, v.reason, now_ns);
  }
}

void PrefillEndpoint::on_link_lost(const RankId& peer, const std::string& reason, int64_t now_ns) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  ++links_lost_;
  const std::string why = fmt::format("transport link {} -> {} lost ({}) while {} still accepts connections",
                                      core_.self().str(), peer.str(), reason, peer.str());
  size_t failed = 0;
  for (auto& [id, r] : rooms_) {
    if (r.state.terminal()) continue;
    bool bound = false;
    for (const RankId& d : r.dests) bound |= (d == peer);
    if (!bound) continue;
    fail(id, ErrorCode::kPeerUnreachable, why, core_.self(), now_ns, true);
    ++failed;
  }
  log_event(failed > 0 ? LogLevel::kWarning : LogLevel::kInfo, kComp,
            fmt::format("{}; {} rooms failed; connecting again", why, failed),
            {.code = std::string(code_name(ErrorCode::kPeerUnreachable)), .origin = core_.self().str(),
             .extra = {{"peer", peer.str()}, {"event", "link_lost"}}});
  const PoolRegistration reg = it->second.reg;
  core_.transport().disconnect(it->second.peer);
  peers_.erase(it);
  // The same registration, connected anew (its rooms wait for the connect; a failed connect is
  // connect_failed(): the peer is then treated as dead).
  on_registration(reg);
}

}  // namespace kvferry
