// Where a peer's shared-memory span really is in this process (docs/transport.md "Spans").
//
// Over shm a put is a memcpy by UCX into the peer's segment as this process maps it, at
// (announced base + the rkey's offset): both come from the peer. A peer that announces a span
// larger than its segment, or a base that is not its segment's, would have this rank write past
// the mapping (SIGBUS past the file's end, SIGSEGV, or another mapping of this process: its own
// pool, or another peer's). So before a peer is connected, each of its spans is checked where UCX
// would write it: [local, local + bytes) must lie inside ONE shared, writable mapping of this
// process, backed by its file up to the last byte, that holds none of `taken` (our own spans and
// the spans of the other live peers), and that is the very mapping the peer's rkey unpack created
// (new since just before the unpack and of the segment the rkey names: not a segment this process
// mapped before, its own spans', UCX's own fifos' or another peer's, under another name).
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
  uint64_t device = 0;  // makedev(major, minor)
  uint64_t inode = 0;
};
bool find_mapping(uintptr_t addr, Mapping* out);
// Every mapping of this process (empty if /proc/self/maps cannot be read).
std::vector<Mapping> read_mappings();
// The mappings of `after` that `before` does not have (same range and inode) and that map the
// inode `inode` (and, check_device, the device `device`): what one unpack created for a segment.
std::vector<Mapping> new_mappings(const std::vector<Mapping>& before, const std::vector<Mapping>& after,
                                  uint64_t inode, bool check_device, uint64_t device);

// Errors: kProtocolError naming what is wrong (not inside one mapping, not shared or writable, not
// backed to its end, the mapping holds a taken range, `fresh` is given and the mapping is none of
// it: not the mapping the unpack created).
Status check_peer_mapping(const void* local, uint64_t bytes, const std::vector<AddressRange>& taken,
                          const std::vector<Mapping>* fresh = nullptr);

}  // namespace kvferry::ucx
