// The room state machine: one table of allowed transitions (see state.h).
#include "kvferry/state.h"

#include <array>

namespace kvferry {
namespace {

// kAllowed[from][to], indexed by the KVPoll values:
// 0 Failed, 1 Bootstrapping, 2 WaitingForInput, 3 Transferring, 4 Success.
constexpr std::array<std::array<bool, 5>, 5> kAllowed = {{
    //  Fail   Boot   Wait   Xfer   Succ
    {{true, false, false, false, false}},  // Failed: terminal
    {{true, true, true, false, false}},    // Bootstrapping
    {{true, false, true, true, true}},     // WaitingForInput (-> Success: data landed between polls)
    {{true, false, false, true, true}},    // Transferring
    {{false, false, false, false, true}},  // Success: terminal
}};

}  // namespace

bool transition_allowed(KVPoll from, KVPoll to) {
  const int f = static_cast<int>(from);
  const int t = static_cast<int>(to);
  if (f < 0 || f > 4 || t < 0 || t > 4) return false;
  return kAllowed[f][t];
}

bool RoomState::advance(KVPoll to) {
  if (!transition_allowed(state_, to)) return false;
  state_ = to;
  return true;
}

}  // namespace kvferry
