#include "driver/engine.h"

#include <algorithm>
#include <string>
#include <utility>

namespace kvferry {

Decision local_failure(uint64_t room, ErrorCode code, std::string reason, const RankId& self) {
  Decision d;
  d.op = Decision::Op::kFail;
  d.room = room;
  d.code = code;
  d.origin = self.str();
  d.reason = std::move(reason);
  d.first_seen_ns = monotonic_ns();
  d.observed_by_leader = true;
  return d;
}

bool fault_at(const RouterRequest& req, std::string_view kind, const RankId& self) {
  return req.fault && req.fault->kind == kind && req.fault->at == self.str();
}

bool fault_at_peer(const RouterRequest& req, std::string_view kind, const RankId& self,
                   const std::vector<uint32_t>& peers, uint32_t peer_dp_rank) {
  if (!req.fault || req.fault->kind != kind) return false;
  for (uint32_t tp : peers) {
    RankId peer{self.role == Role::kPrefill ? Role::kDecode : Role::kPrefill, 0, tp, peer_dp_rank};
    if (req.fault->at == peer.str()) return true;
  }
  return false;
}

RoomReduction reduce_room(const std::vector<RoomReport>& reports) {
  RoomReduction out;
  for (const RoomReport& r : reports) {
    out.min_poll = static_cast<KVPoll>(std::min(static_cast<int>(out.min_poll), static_cast<int>(r.poll)));
    out.all_drained = out.all_drained && r.drained;
    out.any_quarantine = out.any_quarantine || r.quarantine;
    if (r.poll == KVPoll::Failed) {
      ++out.ranks_failed;
      out.max_failed_ns = std::max(out.max_failed_ns, r.failed_ns);
    }
    if (r.has_failure) {
      bool better = !out.any_failure || r.first_seen_ns < out.winner.first_seen_ns ||
                    (r.first_seen_ns == out.winner.first_seen_ns && r.tp_rank < out.winner.tp_rank);
      if (better) out.winner = r;
      out.any_failure = true;
    }
    if (r.send_ns != 0 && (out.min_send_ns == 0 || r.send_ns < out.min_send_ns)) out.min_send_ns = r.send_ns;
    out.max_success_ns = std::max(out.max_success_ns, r.success_ns);
    out.bytes += r.bytes;
    out.verified += r.verified;
    out.mismatched += r.mismatched;
  }
  if (reports.empty()) out.min_poll = KVPoll::Bootstrapping;
  return out;
}

}  // namespace kvferry
