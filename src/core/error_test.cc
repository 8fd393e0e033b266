#include "kvferry/error.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

TEST(ErrorCode, NamesRoundTrip) {
  EXPECT_EQ(code_name(ErrorCode::kOk), "ok");
  EXPECT_EQ(code_name(ErrorCode::kTransferError), "transfer_error");
  EXPECT_EQ(code_name(ErrorCode::kPeerUnreachable), "peer_unreachable");
  EXPECT_EQ(code_name(ErrorCode::kBootstrapTimeout), "bootstrap_timeout");
  EXPECT_EQ(code_name(ErrorCode::kWaitingTimeout), "waiting_timeout");
  EXPECT_EQ(code_name(ErrorCode::kPreallocTimeout), "prealloc_timeout");
  EXPECT_EQ(code_name(ErrorCode::kAborted), "aborted");
  EXPECT_EQ(code_name(ErrorCode::kProtocolError), "protocol_error");
  EXPECT_EQ(code_name(ErrorCode::kResourceExhausted), "resource_exhausted");
  EXPECT_EQ(code_name(ErrorCode::kInjected), "injected");
  EXPECT_EQ(code_name(ErrorCode::kInvalidArgument), "invalid_argument");
  EXPECT_EQ(code_name(ErrorCode::kInternal), "internal");
  EXPECT_EQ(code_name(ErrorCode::kIntegrityError), "integrity_error");
  EXPECT_EQ(code_name(ErrorCode::kIncompatiblePeer), "incompatible_peer");
  EXPECT_EQ(static_cast<int>(ErrorCode::kIncompatiblePeer), 12);
  EXPECT_EQ(static_cast<int>(ErrorCode::kIntegrityError), 13);
  for (int v = 0; v <= kMaxErrorCode; ++v) {
    auto c = code_from_int(v);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(code_from_name(code_name(*c)), c);
  }
  EXPECT_FALSE(code_from_int(kMaxErrorCode + 1).has_value());
  EXPECT_FALSE(code_from_int(-1).has_value());
  EXPECT_FALSE(code_from_name("Transfer_Error").has_value());
  EXPECT_FALSE(code_from_name("").has_value());
}

TEST(RankId, StrForms) {
  EXPECT_EQ((RankId{Role::kPrefill, 0, 1, 0}).str(), "prefill/tp1");
  EXPECT_EQ((RankId{Role::kDecode, 0, 0, 0}).str(), "decode/tp0");
  EXPECT_EQ((RankId{Role::kDecode, 0, 3, 2}).str(), "decode/tp3/dp2");
  EXPECT_EQ((RankId{Role::kPrefill, 1, 0, 0}).str(), "prefill1/tp0");
  EXPECT_EQ((RankId{Role::kPrefill, 12, 7, 5}).str(), "prefill12/tp7/dp5");
}

TEST(RankId, ParseIsTheInverse) {
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    for (uint32_t e : {0u, 1u, 10u}) {
      for (uint32_t tp : {0u, 1u, 15u}) {
        for (uint32_t dp : {0u, 3u}) {
          RankId id{role, e, tp, dp};
          auto back = RankId::parse(id.str());
          ASSERT_TRUE(back.has_value()) << id.str();
          EXPECT_EQ(*back, id) << id.str();
        }
      }
    }
  }
}

TEST(RankId, RejectsJunk) {
  for (const char* s : {"", "prefill", "prefill/", "prefill/tp", "foo/tp1", "prefill/tp-1", "prefill/tp+1",
                        "prefill/tp1/", "prefill/tp1/dp", "prefill/tp1/dp0", "prefill0/tp1", "prefill/tp01",
                        "Prefill/tp1", "decode/tp1x", "decode/tp1/xx1", " decode/tp1", "decode/tp99999999999",
                        "prefillx/tp1", "decode/dp1", "decode/tp1/dp1/dp2"}) {
    EXPECT_FALSE(RankId::parse(s).has_value()) << "'" << s << "'";
  }
}

TEST(Status, Str) {
  EXPECT_EQ(Status().str(), "ok");
  EXPECT_TRUE(Status::Ok().ok());
  Status s(ErrorCode::kProtocolError, "bad page index 9");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.str(), "protocol_error: bad page index 9");
  Result<int> r(ErrorCode::kAborted, "by router");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kAborted);
  Result<int> v(5);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 5);
  EXPECT_TRUE(v.status().ok());
}

TEST(KVTransferError, Str) {
  KVTransferError e;
  e.bootstrap_room = 123;
  e.code = ErrorCode::kTransferError;
  e.failure_reason = "flush failed";
  e.origin = RankId{Role::kPrefill, 0, 1, 0};
  e.is_from_another_rank = true;
  EXPECT_EQ(e.str(), "room 123: transfer_error at prefill/tp1 (from another rank): flush failed");
  e.is_from_another_rank = false;
  EXPECT_EQ(e.str(), "room 123: transfer_error at prefill/tp1: flush failed");
}

TEST(Clock, MonotonicAdvances) {
  const int64_t a = monotonic_ns();
  const int64_t b = monotonic_ns();
  EXPECT_GT(a, 0);
  EXPECT_GE(b, a);
}

}  // namespace
}  // namespace kvferry
