// Frames between the replay router and the orchestrator for planned peer deaths (fault plan
// kind peer_death), JSON text over ControlSocket (ZeroMQ), to the orchestrator's / router's
// endpoint. Replay-only: engines never see them (the engine protocol is driver/engine_protocol.h).
//   {"type":"kill","rank":"prefill/tp1"}                         router asks for the planned kill
//   {"type":"killed","rank":..,"time_ns":N}                      SIGKILL sent at N (CLOCK_MONOTONIC)
//   {"type":"restarted","rank":..,"time_ns":N}                   same command line started again
//   {"type":"kill_failed","rank":..,"reason":".."}               the kill or the restart failed
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "kvferry/error.h"

namespace kvferry::replay {

struct PeerDeathFrame {
  std::string type;     // kill, killed, restarted, kill_failed
  std::string rank;     // RankId::str()
  int64_t time_ns = 0;  // killed, restarted
  std::string reason;   // kill_failed
};

// `type` is kill, killed, restarted or kill_failed.
std::string encode_peer_death(const std::string& type, const std::string& rank, int64_t time_ns,
                              const std::string& reason);
// nullopt when `text` is a JSON object whose "type" is not a peer-death type (another protocol's
// frame); kProtocolError when it is not JSON, has no string "type", or is a peer-death frame with
// a missing or mistyped field or a rank that is not a RankId.
Result<std::optional<PeerDeathFrame>> decode_peer_death_frame(const std::string& text);

}  // namespace kvferry::replay
