// JSON frames of the engine's per-step agreement (leader tp0 <-> followers), internal to an engine:
//   {"type":"hello","tp_rank":R,"endpoint":"tcp://..."}                       follower -> leader
//   {"type":"step","seq":K,"shutdown":false,"decisions":[Decision...]}       leader -> followers
//   {"type":"reply","seq":K,"tp_rank":R,"rooms":[RoomReport...],"stats":{}}  follower -> leader
//   {"type":"abort","room":"<u64>"}                                         router -> leader
// Room ids are decimal strings. Parsing never throws: malformed frames give kProtocolError.
#pragma once
#include <string>
#include <vector>

#include "driver/engine.h"

namespace kvferry {

struct SyncFrame {
  std::string type;  // hello, step, reply, or a router frame type (request, shutdown, ...)
  uint32_t tp_rank = 0;
  std::string endpoint;
  uint64_t seq = 0;
  uint64_t room = 0;  // abort
  bool shutdown = false;
  std::vector<Decision> decisions;
  std::vector<RoomReport> rooms;
  RankLeakStats stats;
  std::string raw;  // the frame text (router frames are decoded by router_protocol)
};

std::string encode_hello(uint32_t tp_rank, const std::string& endpoint);
std::string encode_step(uint64_t seq, bool shutdown, const std::vector<Decision>& decisions);
std::string encode_reply(uint64_t seq, uint32_t tp_rank, const std::vector<RoomReport>& rooms,
                         const RankLeakStats& stats);
Result<SyncFrame> decode_sync_frame(const std::string& text);

}  // namespace kvferry
