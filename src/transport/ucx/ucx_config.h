// How kvferry configures UCX per transport kind (see docs/transport.md for the measurements).
// Thread contract: functions are thread-safe.
#pragma once
#include <ucs/type/status.h>

#include <cstdint>
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

// Size of UCX's shared-memory fragments for the shm transport (UCT option MM_SEG_SIZE of the posix
// and sysv interfaces; UCX's default is 8256). create_context sets it on the transport's own ucp
// config with ucp_config_modify(config, "MM_SEG_SIZE", ...): UCX applies that name to the posix and
// sysv interfaces of this context only (ucp_apply_uct_config_list), so the process environment is
// left alone and UCX_POSIX_SEG_SIZE / UCX_SYSV_SEG_SIZE there do not reach the transport.
// Why: a put into memory UCX cannot map into the writer (engine buffers over shm, e.g. vLLM's
// per-layer tensors) is carried as active messages of at most this many bytes, each copied by both
// ends. 32 KiB of payload plus 64 bytes (as UCX's 8 KiB + 64): 4x fewer fragments, about 2x the
// GB/s into such memory in `kvferry bench --memory engine` and about 4x in the Python module's
// transfer_bench.py (docs/transport.md "Shared-memory fragment size", issue 33c).
// Why not from the environment: UCX 1.13's worker address (v1) does not carry it, so a writer packs
// fragments of its own size into descriptors the receiver sized with its own: a writer with the
// larger size crashes the receiver (measured). Every rank of one build gets the same value this way.
inline constexpr uint64_t kShmSegSize = 32832;
// UCX 1.13 stores a fragment's length in uct_mm_fifo_element_t::length, a uint16_t
// (src/uct/sm/mm/base/mm_iface.h; written in uct_mm_ep_am_common_send, src/uct/sm/mm/base/mm_ep.c),
// while a fragment may be as long as the segment size (uct_mm_iface_query: am.max_bcopy = seg_size):
// above 65535 the length wraps and puts into such memory lose their bytes (measured with 65536).
static_assert(kShmSegSize <= 65535, "UCX 1.13's mm fragment length is 16 bits");

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
