// KVPoll: the state of one room on one rank, as a scheduler polls it.
//
// Numbering is SGLang's (python/sglang/srt/disaggregation/base/conn.py, class KVPoll) and matters:
// the engine's ranks agree on a room's state by taking the MIN over ranks, so one Failed rank makes
// the room Failed everywhere, and the room is Success only when every rank is.
// Thread contract: plain values; free functions are thread-safe.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvferry {

enum class KVPoll : int {
  Failed = 0,
  Bootstrapping = 1,
  WaitingForInput = 2,
  Transferring = 3,
  Success = 4,
};

// "Failed", "Bootstrapping", ... (the enum's own names).
std::string_view to_string(KVPoll p);
// Inverse of to_string; nullopt for an unknown name.
std::optional<KVPoll> poll_from_string(std::string_view s);
// Inverse of static_cast<int>; nullopt outside 0..4 (a malformed message, never UB).
std::optional<KVPoll> poll_from_int(int v);

}  // namespace kvferry
