// KVPoll names and checked conversions.
#include "kvferry/poll.h"

namespace kvferry {

std::string_view to_string(KVPoll p) {
  switch (p) {
    case KVPoll::Failed: return "Failed";
    case KVPoll::Bootstrapping: return "Bootstrapping";
    case KVPoll::WaitingForInput: return "WaitingForInput";
    case KVPoll::Transferring: return "Transferring";
    case KVPoll::Success: return "Success";
  }
  return "Unknown";
}

std::optional<KVPoll> poll_from_string(std::string_view s) {
  for (int v = 0; v <= 4; ++v) {
    auto p = static_cast<KVPoll>(v);
    if (to_string(p) == s) return p;
  }
  return std::nullopt;
}

std::optional<KVPoll> poll_from_int(int v) {
  if (v < 0 || v > 4) return std::nullopt;
  return static_cast<KVPoll>(v);
}

}  // namespace kvferry
