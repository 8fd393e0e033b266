// The failure board (bootstrap/failure_board.h): the root-cause rule decides which post a room
// keeps whatever their order, refused posts change nothing, and every bound holds; and the routes
// through a real BootstrapServer and BootstrapClient.
#include "bootstrap/failure_board.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/failure_json.h"
#include "kvferry/bootstrap.h"

namespace kvferry::bootstrap {
namespace {

constexpr int64_t kWall = 1'800'000'000'000'000'000;  // some CLOCK_REALTIME instant (2027)

Failure record(ErrorCode code, const char* origin, int64_t wall_ns, std::string reason = "why") {
  Failure f;
  f.code = code;
  f.origin = *RankId::parse(origin);
  f.reason = std::move(reason);
  f.first_seen_ns = 1000;
  f.wall_ns = wall_ns;
  return f;
}

nlohmann::json body(uint64_t room, const Failure& f) {
  nlohmann::json j = {{"room", std::to_string(room)}};
  put_failure(j, f);
  return j;
}

std::string origin_of(FailureBoard& b, uint64_t room, int64_t now = 0) {
  const std::string r = std::to_string(room);
  Reply rep = b.get(&r, now);
  if (rep.status != 200) return "status " + std::to_string(rep.status);
  return nlohmann::json::parse(rep.body).at("origin").get<std::string>();
}

TEST(FailureBoard, KeepsTheRootCauseWhateverTheOrderOfPosts) {
  const Failure cause = record(ErrorCode::kTransferError, "prefill/tp1", kWall);
  const Failure consequence = record(ErrorCode::kWaitingTimeout, "decode/tp0", kWall + 1'000'000'000);
  for (bool cause_first : {true, false}) {
    FailureBoard b;
    EXPECT_EQ(b.post(body(9, cause_first ? cause : consequence), "10.0.0.1", 0, kWall).status, 200);
    EXPECT_EQ(b.post(body(9, cause_first ? consequence : cause), "10.0.0.2", 0, kWall).status, 200);
    EXPECT_EQ(origin_of(b, 9), "prefill/tp1") << "cause first: " << cause_first;
    EXPECT_EQ(b.size(), 1u);
  }
}

TEST(FailureBoard, RefusedPostsChangeNothing) {
  FailureBoard b;
  ASSERT_EQ(b.post(body(5, record(ErrorCode::kAborted, "decode/tp1", kWall)), "h", 0, kWall).status, 200);
  auto bad = [&](nlohmann::json j) { return b.post(j, "h", 0, kWall).status; };
  nlohmann::json j = body(5, record(ErrorCode::kTransferError, "prefill/tp0", kWall - 1'000'000'000));
  for (const char* drop : {"room", "code", "origin", "reason", "first_seen_ns"}) {
    nlohmann::json k = j;
    k.erase(drop);
    EXPECT_EQ(bad(k), 400) << drop;
  }
  nlohmann::json k = j;
  k["room"] = 5;  // not a decimal string
  EXPECT_EQ(bad(k), 400);
  k = j;
  k["room"] = "18446744073709551616";  // 2^64
  EXPECT_EQ(bad(k), 400);
  k = j;
  k["origin"] = "prefill/tpX";
  EXPECT_EQ(bad(k), 400);
  k = j;
  k["code"] = "ok";
  EXPECT_EQ(bad(k), 400);
  k = j;
  k["wall_ns"] = 0;  // unknown wall clock: it would be ordered by another host's monotonic clock
  EXPECT_EQ(bad(k), 400);
  k = j;
  k["wall_ns"] = kWall - 301'000'000'000;  // stamped far behind: it would win against every true record
  EXPECT_EQ(bad(k), 400);
  EXPECT_EQ(bad(nlohmann::json::array()), 400);
  EXPECT_EQ(origin_of(b, 5), "decode/tp1");
  EXPECT_EQ(b.size(), 1u);
  const std::string junk = "12x";
  EXPECT_EQ(b.get(&junk, 0).status, 400);
  EXPECT_EQ(b.get(nullptr, 0).status, 400);
  const std::string other = "6";
  EXPECT_EQ(b.get(&other, 0).status, 404);
}

TEST(FailureBoard, BoundsReasonsSourcesAndAge) {
  FailureBoard b;
  ASSERT_EQ(b.post(body(1, record(ErrorCode::kAborted, "decode/tp0", kWall, std::string(100000, 'x'))), "h", 0, kWall)
                .status,
            200);
  const std::string one = "1";
  EXPECT_EQ(nlohmann::json::parse(b.get(&one, 0).body).at("reason").get<std::string>().size(),
            kFailureBoardReasonBytes);
  // One source fills its share; the next post from it is refused, another source still posts.
  for (uint64_t room = 2; room <= kFailureBoardRoomsPerSource; ++room)
    ASSERT_EQ(b.post(body(room, record(ErrorCode::kAborted, "decode/tp0", kWall)), "h", 0, kWall).status, 200);
  EXPECT_EQ(b.post(body(999'999, record(ErrorCode::kAborted, "decode/tp0", kWall)), "h", 0, kWall).status, 429);
  EXPECT_EQ(b.post(body(999'999, record(ErrorCode::kAborted, "decode/tp1", kWall)), "g", 0, kWall).status, 200);
  EXPECT_EQ(b.size(), kFailureBoardRoomsPerSource + 1);
  // Full: the oldest record goes, so a flood from a few addresses never locks a real post out.
  for (const char* src : {"s1", "s2", "s3"})
    for (uint64_t i = 0; i < kFailureBoardRoomsPerSource; ++i)
      ASSERT_EQ(b.post(body(1'000'000 + i + (src[1] - '0') * 100'000, record(ErrorCode::kAborted, "decode/tp0", kWall)),
                       src, 1, kWall)
                    .status,
                200);
  ASSERT_EQ(b.size(), kFailureBoardRooms);
  EXPECT_EQ(b.post(body(42, record(ErrorCode::kTransferError, "prefill/tp1", kWall)), "real", 2, kWall).status, 200);
  EXPECT_EQ(origin_of(b, 42, 2), "prefill/tp1");
  EXPECT_EQ(origin_of(b, 1, 2), "status 404");  // the oldest went
  EXPECT_EQ(b.size(), kFailureBoardRooms);
  // Records expire; then the source may post again.
  EXPECT_EQ(origin_of(b, 999'999, kFailureBoardTtlNs + 2), "status 404");
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.post(body(3, record(ErrorCode::kAborted, "decode/tp0", kWall)), "h", kFailureBoardTtlNs + 2, kWall).status,
            200);
}

TEST(FailureBoard, ThroughTheBootstrapService) {
  auto server = BootstrapServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().str();
  BootstrapClient client("127.0.0.1:" + std::to_string((*server)->port()), 2000, nullptr);
  auto none = client.lookup_failure(42);
  ASSERT_TRUE(none.ok()) << none.status().str();
  EXPECT_FALSE(none->has_value());
  Failure f = record(ErrorCode::kTransferError, "prefill/tp1", realtime_ns(), "write failed");
  ASSERT_TRUE(client.post_failure(42, f).ok());
  auto got = client.lookup_failure(42);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().str();
  EXPECT_EQ(**got, f);
  f.wall_ns = 0;
  EXPECT_EQ(client.post_failure(43, f).code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(client.lookup_failure(43)->has_value());
}

}  // namespace
}  // namespace kvferry::bootstrap
