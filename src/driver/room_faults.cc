// RoomFaults (room_faults.h).
#include "driver/room_faults.h"

namespace kvferry {

RoomFaults::RoomFaults(const std::optional<FaultSpec>& fault, const RankId& self) : fault_(fault), self_(self) {}

bool RoomFaults::fail_here() const {
  return at_self(self_.role == Role::kPrefill ? FaultKind::kPrefillFail : FaultKind::kDecodeFail);
}

bool RoomFaults::silent_toward(const std::vector<RankId>& peers) const {
  if (!fault_ || fault_->kind != FaultKind::kTimeout) return false;
  const Role other = self_.role == Role::kPrefill ? Role::kDecode : Role::kPrefill;
  for (const RankId& p : peers) {
    // A decode peer's engine id is its instance (xPyD replays); prefill ranks are engine 0.
    if (fault_->at == RankId{other, p.engine_id, p.tp_rank, p.dp_rank}) return true;
  }
  return false;
}

}  // namespace kvferry
