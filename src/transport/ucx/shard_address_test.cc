#include "transport/ucx/shard_address.h"

#include <gtest/gtest.h>

#include "kvferry/transport.h"

namespace kvferry::ucx {
namespace {

std::string header(uint8_t version, uint8_t count) {
  std::string s(kShardAddressMagic);
  s.push_back(static_cast<char>(version));
  s.push_back(static_cast<char>(count));
  return s;
}

std::string entry(const std::string& bytes) {
  std::string s;
  uint32_t n = static_cast<uint32_t>(bytes.size());
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return s + bytes;
}

TEST(ShardAddress, OneWorkerIsThePlainAddressBothWays) {
  std::string plain("\x01\x02ucx-worker\0addr", 16);
  EXPECT_EQ(encode_shard_address({plain}), plain);
  auto parsed = parse_shard_address(plain);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, std::vector<std::string>{plain});
}

TEST(ShardAddress, SeveralWorkersRoundTripInOrder) {
  std::vector<std::string> workers = {std::string("a\0b", 3), std::string(300, 'x'), "z"};
  std::string enc = encode_shard_address(workers);
  EXPECT_EQ(enc, header(1, 3) + entry(workers[0]) + entry(workers[1]) + entry(workers[2]));
  auto parsed = parse_shard_address(enc);
  ASSERT_TRUE(parsed.ok()) << parsed.status().str();
  EXPECT_EQ(*parsed, workers);
}

TEST(ShardAddress, MalformedInputIsRejectedWithItsReason) {
  struct Case {
    std::string input;
    std::string reason;
  };
  const std::string good = header(1, 2) + entry("ab") + entry("cde");
  const std::vector<Case> cases = {
      {"", "empty"},
      {std::string(kShardAddressMagic), "truncated header"},
      {header(2, 1) + entry("ab"), "version 2"},
      {header(1, 0), "0 shards"},
      {header(1, kMaxTransportShards + 1), "9 shards"},
      {header(1, 2) + entry("ab"), "shard 1: truncated length"},
      {header(1, 1) + std::string("\x05\0\0\0ab", 6), "shard 0: 5 bytes announced, 2 left"},
      {header(1, 1) + entry(""), "shard 0: empty address"},
      {good + "!", "1 trailing bytes"},
      {good.substr(0, good.size() - 1), "shard 1: 3 bytes announced, 2 left"},
  };
  for (const Case& c : cases) {
    auto r = parse_shard_address(c.input);
    ASSERT_FALSE(r.ok()) << c.reason;
    EXPECT_EQ(r.status().code(), ErrorCode::kProtocolError);
    EXPECT_NE(r.status().message().find(c.reason), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("malformed sharded worker address"), std::string::npos);
  }
  auto ok = parse_shard_address(good);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<std::string>{"ab", "cde"}));
}

}  // namespace
}  // namespace kvferry::ucx
