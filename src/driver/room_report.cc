#include "driver/room_report.h"

namespace kvferry {

std::optional<Failure> own_failure(const std::optional<KVTransferError>& e, const RankId& self) {
  if (!e) return std::nullopt;
  if (!e->is_from_another_rank && e->origin == self) return e->failure();
  for (const Failure& f : e->superseded)
    if (f.origin == self) return f;
  return std::nullopt;
}

void report_failure(RoomReport& rep, const KVTransferError& e) {
  rep.has_failure = true;
  rep.code = e.code;
  rep.origin = e.origin.str();
  rep.reason = e.failure_reason;
  rep.first_seen_ns = e.first_seen_ns;
  rep.wall_ns = e.wall_ns;
}

RankLeakStats leak_stats_of(const RankId& self, const ManagerStats& m) {
  RankLeakStats s;
  s.rank = self.str();
  s.live_rooms = m.live_rooms;
  s.records = m.failure_records;
  s.peers = m.peers;
  s.stale_messages = {m.stale_registrations, m.stale_metadata, m.stale_statuses, m.stale_heartbeats};
  s.peer_restarts = m.peer_restarts;
  s.refusals = m.refusals;
  s.transport = m.transport;
  s.control = {m.control_frames_sent, m.control_bytes_sent, m.control_frames_received, m.control_bytes_received,
               m.heartbeats_sent};
  return s;
}

}  // namespace kvferry
