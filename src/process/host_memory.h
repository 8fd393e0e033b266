// Host memory as /proc/meminfo reports it, for sizing pools before ranks are started (replay, bench).
// Thread contract: pure functions (they read /proc/meminfo). Errors: an unknown field or an
// unreadable file gives 0.
#pragma once
#include <cstdint>
#include <string>

namespace kvferry::process {

// A /proc/meminfo field ("MemTotal", "MemAvailable") in bytes (0 when unknown).
uint64_t meminfo_bytes(const std::string& field);
uint64_t mem_available_bytes();  // meminfo_bytes("MemAvailable")

}  // namespace kvferry::process
