// The room state machine as one table of allowed transitions (docs/design.md §2).
//
// Sender (prefill):   Bootstrapping -> WaitingForInput -> Transferring -> Success
// Receiver (decode):  Bootstrapping -> WaitingForInput -> Transferring -> Success
//                     (WaitingForInput -> Success is allowed: the data may land between polls)
// Any non-terminal state -> Failed. Success and Failed are terminal. Staying put is allowed.
// Thread contract: RoomState is not synchronized; the owner serializes access.
#pragma once
#include "kvferry/poll.h"

namespace kvferry {

// True if a room may move from `from` to `to` (from == to is allowed and is a no-op).
bool transition_allowed(KVPoll from, KVPoll to);

class RoomState {
 public:
  KVPoll get() const { return state_; }
  // Moves to `to` if the table allows it; returns false (and stays) otherwise.
  bool advance(KVPoll to);
  bool terminal() const { return state_ == KVPoll::Success || state_ == KVPoll::Failed; }

 private:
  KVPoll state_ = KVPoll::Bootstrapping;
};

}  // namespace kvferry
