#include "transport/ucx/ucx_config.h"

#include <cstdlib>
#include <mutex>

namespace kvferry {

std::string_view transport_name(TransportKind k) {
  return k == TransportKind::kShm ? "shm" : "tcp";
}

namespace ucx {

std::string default_tls(TransportKind kind) {
  return kind == TransportKind::kShm ? "posix,sysv,self" : "tcp,self";
}

std::string tls_for(const TransportOptions& options) {
  return options.ucx_tls_override.empty() ? default_tls(options.kind) : options.ucx_tls_override;
}

void enable_shm_error_handling_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    setenv("UCX_POSIX_ERROR_HANDLING", "y", /*overwrite=*/0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", /*overwrite=*/0);
  });
}

ErrorCode code_for(ucs_status_t s) {
  switch (s) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
      return ErrorCode::kPeerUnreachable;
    default:
      return ErrorCode::kTransferError;
  }
}

Status ucx_error(ErrorCode code, const std::string& what, ucs_status_t s) {
  return {code, what + ": " + ucs_status_string(s)};
}

Status ucx_failure(const std::string& what, ucs_status_t s) {
  return ucx_error(code_for(s), what, s);
}

}  // namespace ucx
}  // namespace kvferry
