// Where a peer's shared-memory span really is in this process (docs/transport.md "Spans").
//
// Over shm a put is a memcpy by UCX into the peer's segment as this process maps it, at
// (announced base + the rkey's offset): both come from the peer. A peer that announces a span
// larger than its segment, or a base that is not its segment's, would have this rank write past
// the mapping (SIGBUS past the file's end, SIGSEGV, or another mapping of this process: its own
// pool, or another peer's). So before a peer is connected, each of its spans is checked where UCX
// would write it: [local, local + bytes) must lie inside ONE shared, writable mapping of this
// process, backed by its file up to the last byte, that holds none of `taken` (our own spans and
// the spans of the other live peers).
//
// Thread contract: free functions, safe from any thread (they read /proc/self/maps).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::ucx {

// A range of this process's addresses: [lo, hi).
using AddressRange = std::pair<uintptr_t, uintptr_t>;

// The mapping of /proc/self/maps that contains `addr`, if any: its [start, end), whether it is
// shared and writable.
struct Mapping {
  uintptr_t start = 0;
  uintptr_t end = 0;
  bool shared = false;
  bool writable = false;
};
bool find_mapping(uintptr_t addr, Mapping* out);

// Errors: kProtocolError naming what is wrong (not inside one mapping, not shared or writable, not
// backed to its end, the mapping holds a taken range).
Status check_peer_mapping(const void* local, uint64_t bytes, const std::vector<AddressRange>& taken);

}  // namespace kvferry::ucx
