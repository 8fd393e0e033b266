// How kvferry configures UCX per transport kind (see docs/transport.md for the measurements).
// Thread contract: functions are thread-safe.
#pragma once
#include <ucs/type/status.h>

#include <string>

#include "kvferry/transport.h"

namespace kvferry::ucx {

// UCX_TLS used for `kind` unless TransportOptions::ucx_tls_override is set.
//   kShm: "posix,sysv,self"   kTcp: "tcp,self"   (cma is never chosen in peer error mode)
std::string default_tls(TransportKind kind);
// options.ucx_tls_override, or default_tls(options.kind).
std::string tls_for(const TransportOptions& options);

// UCX 1.13 hides shared-memory transports from peer error-handling mode unless
// UCX_POSIX_ERROR_HANDLING / UCX_SYSV_ERROR_HANDLING are "y". Sets both in the environment (once
// per process, before ucp_config_read) without overriding values the user set explicitly.
void enable_shm_error_handling_env();

// Interval for UCX keepalive rounds (how fast a dead shared-memory peer is noticed) unless
// UCX_KEEPALIVE_INTERVAL is set in the environment.
inline constexpr const char* kDefaultKeepaliveInterval = "200ms";

// Connection-level UCX failures (unreachable, reset, timeout, rejected) map to kPeerUnreachable,
// anything else to kTransferError.
ErrorCode code_for(ucs_status_t s);
// Status(code, "<what>: <ucs_status_string(s)>").
Status ucx_error(ErrorCode code, const std::string& what, ucs_status_t s);
// Status(code_for(s), "<what>: <ucs_status_string(s)>").
Status ucx_failure(const std::string& what, ucs_status_t s);

}  // namespace kvferry::ucx
