// Which data-parallel (DP) group serves a room. Each DP group of an engine is its own TP engine
// (a leader and its followers); a room (bootstrap_room) is served by exactly one DP group of the
// prefill engine and one of the decode engine. By default, as in SGLang's disaggregation when no
// explicit DP rank is given, the group is bootstrap_room % dp_size.
// The one rule: the ranks (prefill/decode endpoints: which peers to talk to) and the replay
// router (where to send a request) both call this, so they cannot disagree.
// Thread contract: pure function.
#pragma once
#include <cstdint>

namespace kvferry {

// DP group in [0, dp_size) serving `room`; dp_size 0 is treated as 1.
inline uint32_t dp_rank_for_room(uint64_t room, uint32_t dp_size) {
  return dp_size <= 1 ? 0 : static_cast<uint32_t>(room % dp_size);
}

}  // namespace kvferry
