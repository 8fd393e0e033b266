// Thin adapter from the rank's memory map to today's single-region Transport (kvferry/transport.h
// create_region / register_region / RemoteRegionInfo{base, bytes}), until the transport offers
// register_spans and span-based connect (the helpers' shared contract). Dropped when it does:
// register_map() becomes transport.register_spans(map spans), region_info() becomes
// RemoteRegionInfo{worker_address, spans}.
//
// With one region, several spans are registered as their hull [lowest address, highest end): the
// map places every span at offset = address - lowest address, so the hull's offsets are the map's
// offsets. That needs the hull to be registrable memory (the test arenas are; separate engine
// allocations may not be, then registration fails with the transport's error). Device memory is
// refused: it needs register_spans with UCX CUDA support.
// Thread contract: called from the rank's main thread at start-up and on registration.
#pragma once
#include <string>
#include <vector>

#include "endpoint/memory_map.h"
#include "kvferry/error.h"
#include "kvferry/messages.h"
#include "kvferry/transport.h"

namespace kvferry {

// Registers the map's memory with `t` (the fast path: create_region, then map.bind_region) and
// returns the spans to publish in the pool registration.
Result<std::vector<RegionSpan>> register_map(Transport& t, MemoryMap& map);

// What connect() needs for a peer that published `spans`. Errors: kProtocolError when the spans
// cannot be one region (different rkeys or address-to-offset deltas), which only register_spans
// peers publish.
Result<RemoteRegionInfo> region_info(const std::string& worker_address, const std::vector<RegionSpan>& spans);

}  // namespace kvferry
