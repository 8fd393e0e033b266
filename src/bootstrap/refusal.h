// A bootstrap service's answer that waiting will not change (docs/security.md): 401 or 403, the
// caller's request MAC is not the cluster's (no KVFERRY_SECRET_FILE, or another secret) or its
// timestamp is outside the service's window (clocks apart by more than 120 s).
// BootstrapClient (client.cc) reports it as kInvalidArgument "...: not authorized (HTTP 401...";
// the loops that retry a lookup or a registration until lookup_timeout_ms stop at it at once. So
// do the lookups at a 410 (rank_left below).
#pragma once

#include <string_view>

#include "kvferry/error.h"

namespace kvferry::bootstrap {

inline constexpr std::string_view kNotAuthorized = ": not authorized (HTTP ";

inline bool not_authorized(const Status& s) {
  return s.code() == ErrorCode::kInvalidArgument && s.message().find(kNotAuthorized) != std::string::npos;
}

// A lookup of a rank that left (HTTP 410: it removed its entry, DELETE /route, and has not
// registered again): BootstrapClient reports kPeerUnreachable "... left: ..."; lookups stop at it.
inline constexpr std::string_view kLeft = ": rank left (HTTP 410): ";

inline bool rank_left(const Status& s) {
  return s.code() == ErrorCode::kPeerUnreachable && s.message().find(kLeft) != std::string::npos;
}

// An answer that waiting will not change: the loops that retry stop at it.
inline bool permanent(const Status& s) { return not_authorized(s) || rank_left(s); }

}  // namespace kvferry::bootstrap
