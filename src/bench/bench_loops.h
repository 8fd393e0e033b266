// The two loops of a `kvferry bench-rank` process (bench.h describes the protocol), driven only
// through the public API (kvferry/manager.h), as an engine drives kvferry: one Sender per room on
// prefill (init once decode's metadata is there, chunked send(), take_completed_sends() to return
// a chunk's staging pages, release at Success or once release-safe after a failure), one Receiver
// per room on decode (init, send_metadata, release at Success or once release-safe; quarantined
// pages come back through take_reclaimed_rooms()).
// Thread contract: the rank's main thread only (a caller-pumped manager).
#pragma once
#include <string>
#include <vector>

#include "bench/bench.h"
#include "endpoint/topology.h"
#include "kvferry/manager.h"

namespace kvferry::bench {

int run_prefill(const BenchRankOptions& o, Manager& m, const std::vector<HeadTransfer>& plan, const std::string& name);
int run_decode(const BenchRankOptions& o, Manager& m, const std::string& name);

}  // namespace kvferry::bench
