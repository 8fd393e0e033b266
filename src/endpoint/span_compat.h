// The rank's memory map (endpoint/memory_map.h) as the transport registers and connects it
// (kvferry/transport.h: create_region, register_spans, RemoteRegionInfo with spans).
//
// The fast path (a contiguous pool the transport allocates) is one create_region span at offset 0;
// engine-owned buffers and kvferry's guard rows are registered span by span (each its own packed
// rkey). A device (kCuda) span is refused by the transport itself, naming the UCX support needed.
// Thread contract: called from the rank's main thread at start-up and on registration.
#pragma once
#include <string>
#include <vector>

#include "endpoint/memory_map.h"
#include "kvferry/error.h"
#include "kvferry/messages.h"
#include "kvferry/transport.h"

namespace kvferry {

// Registers the map's memory with `t` and returns the spans to publish in the pool registration.
Result<std::vector<RegionSpan>> register_map(Transport& t, MemoryMap& map);

// What connect() needs for a peer that published `spans` (the transport checks them again).
Result<RemoteRegionInfo> region_info(const std::string& worker_address, const std::vector<RegionSpan>& spans);

}  // namespace kvferry
