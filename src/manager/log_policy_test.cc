#include "manager/log_policy.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

struct Row {
  Role role;
  bool propagated;
  ErrorCode code;
  LogLevel want;
};

TEST(LogPolicy, Table) {
  const Row rows[] = {
      {Role::kDecode, false, ErrorCode::kTransferError, LogLevel::kError},
      {Role::kPrefill, false, ErrorCode::kTransferError, LogLevel::kWarning},
      {Role::kDecode, false, ErrorCode::kBootstrapTimeout, LogLevel::kError},
      {Role::kPrefill, false, ErrorCode::kBootstrapTimeout, LogLevel::kWarning},
      {Role::kDecode, false, ErrorCode::kProtocolError, LogLevel::kError},
      {Role::kPrefill, false, ErrorCode::kPeerUnreachable, LogLevel::kWarning},
      {Role::kDecode, false, ErrorCode::kInjected, LogLevel::kError},
      {Role::kDecode, true, ErrorCode::kTransferError, LogLevel::kDebug},
      {Role::kPrefill, true, ErrorCode::kInjected, LogLevel::kDebug},
      {Role::kPrefill, true, ErrorCode::kAborted, LogLevel::kDebug},
      {Role::kDecode, false, ErrorCode::kAborted, LogLevel::kInfo},
      {Role::kPrefill, false, ErrorCode::kAborted, LogLevel::kInfo},
      {Role::kDecode, false, ErrorCode::kResourceExhausted, LogLevel::kWarning},
      {Role::kDecode, true, ErrorCode::kResourceExhausted, LogLevel::kDebug},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(failure_log_level(r.role, r.propagated, r.code), r.want)
        << role_name(r.role) << " propagated=" << r.propagated << " " << code_name(r.code);
  }
}

}  // namespace
}  // namespace kvferry
