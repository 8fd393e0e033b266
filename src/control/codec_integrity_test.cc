// The integrity fields of control frames (kvferry/messages.h RoomMetadata::integrity,
// RoomStatus::digest; docs/integrity.md): round trips, the old format unchanged without them, and
// every malformed combination refused whole (a refused frame changes no state).
#include <gtest/gtest.h>

#include <string>

#include "control/codec_test_util.h"
#include "kvferry/messages.h"

namespace kvferry {
namespace {

RoomMetadata sample_metadata(size_t n) {
  RoomMetadata m;
  m.room = 0x7fff'ffff'ffff'fffeull;
  m.sender = RankId{Role::kDecode, 3, 0, 2};
  m.incarnation = 7;
  m.peer_incarnation = 1ull << 63;
  for (size_t i = 0; i < n; ++i) m.kv_indices.push_back(i * 7);
  m.aux_index = 17;
  m.state_indices = {3, 1ull << 33};
  m.expected_senders = 2;
  return m;
}

RoomStatus sample_status() {
  RoomStatus m;
  m.room = 42;
  m.sender = RankId{Role::kPrefill, 0, 1, 0};
  m.incarnation = 1'764'000'000'000'000'001;
  m.peer_incarnation = 5;
  m.state = KVPoll::Failed;
  m.failure.code = ErrorCode::kTransferError;
  m.failure.origin = RankId{Role::kDecode, 3, 0, 2};
  m.failure.reason = "ucp_put_nbx: Endpoint timeout";
  return m;
}

using namespace codec_testing;

// The metadata's flag and the Success's digest round-trip;
// frames without them are the original format, byte for byte.
TEST(Codec, IntegrityFlagAndDigestRoundTrip) {
  RoomMetadata md = sample_metadata(4);
  const size_t plain = encode(Message(md)).size();
  EXPECT_FALSE(round_trip(md).integrity);
  md.integrity = true;
  EXPECT_EQ(encode(Message(md)).size(), plain + 1);
  EXPECT_TRUE(round_trip(md).integrity);

  RoomStatus ok;
  ok.incarnation = 1;
  ok.state = KVPoll::Success;
  ok.failure.code = ErrorCode::kOk;
  const size_t bare = encode(Message(ok)).size();
  EXPECT_FALSE(round_trip(ok).digest.has_value());
  for (uint64_t d : {0ull, 1ull, 0xfedc'ba98'7654'3210ull, ~0ull}) {
    ok.digest = d;
    EXPECT_EQ(encode(Message(ok)).size(), bare + 9);  // flags byte + u64
    const auto back = round_trip(ok);
    ASSERT_TRUE(back.digest.has_value());
    EXPECT_EQ(*back.digest, d);
    EXPECT_TRUE(back.terminal);
  }
}

// A malformed integrity field is refused whole (a refused frame changes no state).
TEST(CodecReject, IntegrityFields) {
  RoomMetadata md = sample_metadata(2);
  md.integrity = true;
  const std::string mf = encode(Message(md));
  std::string g = mf;
  g.back() = 0;  // present but empty: not canonical
  expect_rejected(g, "RoomMetadata.flags");
  g.back() = 3;  // an unknown bit
  expect_rejected(g, "RoomMetadata.flags");
  g.back() = static_cast<char>(0x80);
  expect_rejected(g, "RoomMetadata.flags");

  RoomStatus ok;
  ok.incarnation = 1;
  ok.state = KVPoll::Success;
  ok.failure.code = ErrorCode::kOk;
  ok.digest = 0x0123'4567'89ab'cdefull;
  const std::string sf = encode(Message(ok));
  const size_t flags_at = sf.size() - 9;
  ASSERT_EQ(sf[flags_at], 2);
  g = sf.substr(0, sf.size() - 1);  // the digest cut short
  fix_body_length(g);
  expect_rejected(g, "RoomStatus.digest");
  g = sf.substr(0, flags_at + 1);  // the flag without its digest
  fix_body_length(g);
  expect_rejected(g, "RoomStatus.digest");
  g = sf;
  g[flags_at] = 3;  // not terminal and a digest at once
  expect_rejected(g, "RoomStatus.flags");
  g = sf;
  g.push_back(0);  // a byte after the digest
  fix_body_length(g);
  expect_rejected(g, "trailing");

  RoomStatus failed = sample_status();  // a digest goes with Success only
  failed.digest = 5;
  expect_rejected(encode(Message(failed)), "RoomStatus.flags");
}

}  // namespace
}  // namespace kvferry
