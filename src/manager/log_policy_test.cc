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

TEST(LogPolicy, ReleaseLineOnTheWinnerALoserAndAPropagatedRank) {
  const Failure root{ErrorCode::kWaitingTimeout, RankId{Role::kDecode, 0, 0, 0}, "no data", 100, 1000};
  const Failure lost{ErrorCode::kWaitingTimeout, RankId{Role::kDecode, 0, 1, 0}, "no data either", 101, 1001};
  auto field = [](const FailureLine& l, const std::string& k) {
    for (const auto& [key, v] : l.fields.extra)
      if (key == k) return v;
    return std::string("<none>");
  };
  // The origin: its own failure is the root cause.
  FailureLine w = failure_release_line(Role::kDecode, 7, root, root);
  EXPECT_EQ(w.level, LogLevel::kError);
  EXPECT_FALSE(w.is_from_another_rank);
  EXPECT_EQ(w.msg, "room 7 failed: waiting_timeout at decode/tp0: no data");
  EXPECT_EQ(w.fields.reason, "no data");
  EXPECT_EQ(w.fields.origin, "decode/tp0");
  EXPECT_EQ(w.fields.code, "waiting_timeout");
  EXPECT_EQ(field(w, "is_from_another_rank"), "false");
  EXPECT_EQ(field(w, "superseded_by"), "<none>");
  // A rank whose own failure lost: debug, "superseded by ORIGIN", the root cause in the fields.
  FailureLine l = failure_release_line(Role::kDecode, 7, root, lost);
  EXPECT_EQ(l.level, LogLevel::kDebug);
  EXPECT_TRUE(l.is_from_another_rank);
  EXPECT_EQ(l.fields.origin, "decode/tp0");
  EXPECT_EQ(field(l, "superseded_by"), "decode/tp0");
  EXPECT_EQ(field(l, "superseded_reason"), "no data either");
  EXPECT_NE(l.msg.find("own failure waiting_timeout at decode/tp1: no data either superseded by decode/tp0"),
            std::string::npos) << l.msg;
  // A rank that only heard of it.
  FailureLine p = failure_release_line(Role::kPrefill, 7, root, std::nullopt);
  EXPECT_EQ(p.level, LogLevel::kDebug);
  EXPECT_EQ(field(p, "is_from_another_rank"), "true");
  EXPECT_EQ(field(p, "superseded_by"), "<none>");
}

}  // namespace
}  // namespace kvferry
