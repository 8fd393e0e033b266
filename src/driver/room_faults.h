// RoomFaults: what the fault a room's request carries (FaultSpec, engine_protocol.h) asks of one
// rank. The drivers ask only these questions, where they act; no fault kind is spelled in a
// driver. Built from the request and this rank, cheap to copy; no fault answers false everywhere.
//   kind          at            what the rank is asked
//   prefill_fail  this rank     fail_here(): fail the room when it arrives, before sending (injected)
//   decode_fail   this rank     fail_here(): fail the room when it is admitted (injected)
//   transfer      this rank     fail_transfer(): prefill: the transport fails the room's writes;
//                               decode: declare the arrived data failed (transfer_error)
//   timeout       this rank     peers_silent(): cut this rank's own deadline for the room (prefill:
//                               bootstrap, decode: waiting) to Deadlines::fault_timeout_ms
//   timeout       a peer        silent_toward(peers): stay silent toward that peer, so it times out
//   corrupt       a peer        corrupt_toward(peer): prefill: flip a byte of the first write to that
//                               decode rank in flight (its integrity check names it)
// Thread contract: a value type.
#pragma once
#include <optional>
#include <vector>

#include "driver/engine_protocol.h"

namespace kvferry {

class RoomFaults {
 public:
  RoomFaults() = default;
  RoomFaults(const std::optional<FaultSpec>& fault, const RankId& self);

  bool fail_here() const;
  bool fail_transfer() const { return at_self(FaultKind::kTransfer); }
  bool peers_silent() const { return at_self(FaultKind::kTimeout); }
  // `peers`: the room's peer ranks in the other engine that this rank exchanges data with.
  bool silent_toward(const std::vector<RankId>& peers) const;
  // Prefill: a byte of this rank's first write of the room to `peer` is to be flipped in flight.
  bool corrupt_toward(const RankId& peer) const {
    return fault_ && fault_->kind == FaultKind::kCorrupt && fault_->at == peer && self_.role == Role::kPrefill;
  }

 private:
  bool at_self(FaultKind kind) const { return fault_ && fault_->kind == kind && fault_->at == self_; }

  std::optional<FaultSpec> fault_;
  RankId self_;
};

}  // namespace kvferry
