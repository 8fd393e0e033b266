// The compatibility fingerprint of a rank (kvferry/compat.h), from its manager's configuration
// and the shape its memory registered as.
#pragma once
#include <cstdint>

#include "endpoint/memory_map.h"
#include "kvferry/compat.h"
#include "kvferry/manager.h"

namespace kvferry {

Compat compat_of(const ManagerConfig& c, const MemoryShape& shape, uint32_t prefill_tp, uint32_t decode_tp);

}  // namespace kvferry
