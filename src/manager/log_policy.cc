#include "manager/log_policy.h"

namespace kvferry {

LogLevel failure_log_level(Role role, bool is_from_another_rank, ErrorCode code) {
  if (is_from_another_rank) return LogLevel::kDebug;
  if (code == ErrorCode::kAborted) return LogLevel::kInfo;
  if (code == ErrorCode::kResourceExhausted) return LogLevel::kWarning;
  return role == Role::kDecode ? LogLevel::kError : LogLevel::kWarning;
}

}  // namespace kvferry
