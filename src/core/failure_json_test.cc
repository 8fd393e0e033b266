#include "core/failure_json.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

TEST(FailureJson, RoundTripsFlatFields) {
  Failure f{ErrorCode::kWaitingTimeout, RankId{Role::kDecode, 0, 1, 2}, "no data", 123, 456};
  nlohmann::json j = {{"room", "7"}};
  put_failure(j, f);
  EXPECT_EQ(j["code"], "waiting_timeout");
  EXPECT_EQ(j["origin"], "decode/tp1/dp2");
  EXPECT_EQ(j["reason"], "no data");
  EXPECT_EQ(j["first_seen_ns"], 123);
  EXPECT_EQ(j["wall_ns"], 456);
  EXPECT_EQ(j["room"], "7");
  auto back = get_failure(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(back.ok()) << back.status().str();
  EXPECT_EQ(*back, f);
}

TEST(FailureJson, WallIsOptional) {
  auto f = get_failure(nlohmann::json{{"code", "aborted"}, {"origin", "prefill/tp0"}, {"reason", ""},
                                      {"first_seen_ns", 5}});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->wall_ns, 0);
  EXPECT_EQ(f->code, ErrorCode::kAborted);
}

TEST(FailureJson, RejectsBadFieldsNamingThem) {
  const nlohmann::json good = {{"code", "aborted"}, {"origin", "prefill/tp0"}, {"reason", "x"},
                               {"first_seen_ns", 5}, {"wall_ns", 6}};
  struct Case {
    const char* key;
    nlohmann::json value;  // null: remove the key
    const char* expect;
  };
  const Case cases[] = {
      {"code", nullptr, "room.code: missing"},
      {"code", 4, "room.code: not a string"},
      {"code", "ok", "room.code: 'ok' is not a failure code"},
      {"code", "nope", "room.code: 'nope' is not a failure code"},
      {"origin", "prefill/tpX", "room.origin: 'prefill/tpX' is not a rank"},
      {"origin", nullptr, "room.origin: missing"},
      {"reason", 3, "room.reason: not a string"},
      {"first_seen_ns", -1, "room.first_seen_ns: negative"},
      {"first_seen_ns", "5", "room.first_seen_ns: not an integer"},
      {"first_seen_ns", nullptr, "room.first_seen_ns: missing"},
      {"wall_ns", 1.5, "room.wall_ns: not an integer"},
      {"wall_ns", 18446744073709551615ull, "room.wall_ns: out of range"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    if (c.value.is_null()) j.erase(c.key);
    else j[c.key] = c.value;
    auto f = get_failure(j, "room");
    ASSERT_FALSE(f.ok()) << c.key;
    EXPECT_EQ(f.status().code(), ErrorCode::kProtocolError);
    EXPECT_EQ(f.status().message(), c.expect);
  }
  EXPECT_FALSE(get_failure(nlohmann::json::array()).ok());
}

TEST(FailureJson, LongReasonIsCut) {
  nlohmann::json j = {{"code", "aborted"}, {"origin", "prefill/tp0"},
                      {"reason", std::string(kMaxFailureReasonBytes + 10, 'x')}, {"first_seen_ns", 1}};
  auto f = get_failure(j);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->reason.size(), kMaxFailureReasonBytes);
}

}  // namespace
}  // namespace kvferry
