// JSON form of PrefillRankInfo for the bootstrap HTTP API (server and client share it).
//
// Every field of PrefillRankInfo is a required JSON member of the same name; integers must be
// non-negative and fit u32, strings at most kMaxRankInfoString bytes, tp_rank < tp_size, host a
// host name or IPv4/IPv6 address (no wildcard, kvferry/net.h), control_endpoint "tcp://host:port"
// with such a host and a non-zero port. Unknown members are ignored (forward compatibility).
// Errors name the field, e.g. "field 'tp_rank': expected an unsigned 32-bit integer".
// Thread contract: pure functions.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kvferry/bootstrap.h"

namespace kvferry::bootstrap {

constexpr size_t kMaxRankInfoString = 4096;

nlohmann::json rank_info_to_json(const PrefillRankInfo& info);
// kInvalidArgument naming the offending field.
Result<PrefillRankInfo> rank_info_from_json(const nlohmann::json& j);

// Compact JSON text; invalid UTF-8 in strings is replaced (U+FFFD), never thrown.
std::string dump(const nlohmann::json& j);

// {"error": message} as a compact string.
std::string error_body(const std::string& message);

}  // namespace kvferry::bootstrap
