// Issue 31: what a rank reads of a frame before deciding to decode it (frame_sender), and the
// page-index limit of the receiving rank (decode(frame, max_kv_indices)).
#include <gtest/gtest.h>

#include "kvferry/messages.h"

namespace kvferry {
namespace {

const RankId kDecode{Role::kDecode, 3, 200, 2};

TEST(CodecLimits, FrameSenderOfEveryMessageType) {
  std::vector<Message> all;
  all.push_back(RoomMetadata{7, kDecode, {1, 2}, 0, {}, 1, 5, 0});
  all.push_back(RoomStatus{7, kDecode, KVPoll::Failed, Failure{ErrorCode::kAborted, kDecode, "x", 1, 1}, true, 5, 0});
  all.push_back(Heartbeat{kDecode, 1, 2, 5});
  all.push_back(RegistrationRefusal{kDecode, Failure{ErrorCode::kProtocolError, kDecode, "x", 1, 1}, 5, 0});
  PoolRegistration reg;
  reg.sender = kDecode;
  reg.incarnation = 5;
  all.push_back(reg);  // not decodable (no spans): its sender is read all the same
  for (const Message& m : all) {
    SCOPED_TRACE(std::string(message_name(m)));
    const std::string f = encode(m);
    auto s = frame_sender(f);
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(*s, kDecode);
  }
  const std::string hb = encode(Message{Heartbeat{kDecode, 1, 2, 5}});
  EXPECT_FALSE(frame_sender(hb.substr(0, 14)).has_value());  // the sender cut short
  EXPECT_FALSE(frame_sender("nonsense").has_value());
  std::string other_version = hb;
  other_version[4] = 3;
  EXPECT_FALSE(frame_sender(other_version).has_value());
  std::string bad_role = hb;
  bad_role[12] = 9;
  EXPECT_FALSE(frame_sender(bad_role).has_value());
}

TEST(CodecLimits, MetadataAboveTheRanksPagesIsRefusedBeforeAllocating) {
  const std::string f = encode(Message{RoomMetadata{7, kDecode, std::vector<uint64_t>(17, 1), 0, {}, 1, 5, 0}});
  EXPECT_TRUE(decode(f).ok());
  EXPECT_TRUE(decode(f, 17).ok());
  auto r = decode(f, 16);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kProtocolError);
  EXPECT_NE(r.status().message().find("RoomMetadata.kv_indices: count 17 exceeds the limit 16"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace kvferry
