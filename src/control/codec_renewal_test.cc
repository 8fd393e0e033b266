// The tail a Heartbeat may carry (kvferry/messages.h): the lease renewal (Heartbeat::renew_rooms,
// protocol 6) and the leaving tag (Heartbeat::leaving, protocol 7): round trips alone and behind a
// challenge, an answer or a renewal, and every malformed tail refused with the field named (count
// 0, over kMaxRenewRooms, a room twice, cut, an unknown tag after a probe, bytes after leaving).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "control/codec_test_util.h"
#include "kvferry/messages.h"

namespace kvferry {
namespace {

using namespace codec_testing;

Heartbeat renewal(std::vector<uint64_t> rooms) {
  Heartbeat hb{RankId{Role::kDecode, 0, 1, 0}, 0, 1234567890123ll, 0xabcdull};
  hb.renew_rooms = std::move(rooms);
  return hb;
}

constexpr size_t kTail = 12 + 37;  // header + sender, incarnation, seq, sent_ns

TEST(CodecRenewal, RoomsRoundTripAloneAndBehindAProbe) {
  Heartbeat hb = renewal({7, 0xffffffffffffffffull, 0});
  EXPECT_EQ(round_trip(hb).renew_rooms, hb.renew_rooms);
  EXPECT_EQ(encode(Message(hb)).size(), kTail + 1 + 4 + 3 * 8);
  hb.challenge = 99;
  auto d = round_trip(hb);
  EXPECT_EQ(d.challenge, 99u);
  EXPECT_EQ(d.renew_rooms, hb.renew_rooms);
  hb.challenge = 0;
  hb.answer = 5;
  d = round_trip(hb);
  EXPECT_EQ(d.answer, 5u);
  EXPECT_EQ(d.renew_rooms, hb.renew_rooms);
  std::vector<uint64_t> most(kMaxRenewRooms);
  for (size_t i = 0; i < most.size(); ++i) most[i] = i * 3;
  EXPECT_EQ(round_trip(renewal(most)).renew_rooms.size(), kMaxRenewRooms);
  // No rooms: the original heartbeat, without the tail.
  EXPECT_EQ(encode(Message(renewal({}))).size(), kTail);
}

TEST(CodecRenewal, MalformedListsAreRefusedNamingTheField) {
  const std::string f = encode(Message(renewal({1, 2})));
  ASSERT_EQ(f.size(), kTail + 1 + 4 + 16);
  std::string g = f.substr(0, kTail + 5);
  put_le(g, kTail + 1, 0, 4);  // count 0: an empty list is no tail at all
  fix_body_length(g);
  expect_rejected(g, "Heartbeat.renew_rooms");
  g = f;
  put_le(g, kTail + 1, kMaxRenewRooms + 1, 4);  // over the bound, whatever follows
  expect_rejected(g, "Heartbeat.renew_rooms");
  g = f;
  put_le(g, kTail + 1, 3, 4);  // more rooms than the body holds
  expect_rejected(g, "Heartbeat.renew_rooms");
  g = f;
  put_le(g, kTail + 5 + 8, 1, 8);  // room 1 twice
  expect_rejected(g, "twice");
  g = f.substr(0, f.size() - 3);  // cut
  fix_body_length(g);
  expect_rejected(g, "Heartbeat.renew_rooms");
  g = f;
  g[kTail] = 9;  // no such tag
  expect_rejected(g, "Heartbeat.probe");
  // Behind a challenge, only the renewal tag may follow.
  Heartbeat hb = renewal({4});
  hb.challenge = 1;
  g = encode(Message(hb));
  g[kTail + 9] = 1;
  expect_rejected(g, "Heartbeat.renew");
  g = g.substr(0, kTail + 10);  // the tag alone, no count
  fix_body_length(g);
  g[kTail + 9] = 3;
  expect_rejected(g, "Heartbeat.renew_rooms");
}

TEST(CodecRenewal, LeavingRoundTripsAloneAndLastOfTheTail) {
  Heartbeat hb = renewal({});
  hb.leaving = true;
  EXPECT_EQ(encode(Message(hb)).size(), kTail + 1);
  EXPECT_TRUE(round_trip(hb).leaving);
  EXPECT_FALSE(round_trip(renewal({})).leaving);
  hb.renew_rooms = {8, 9};
  auto d = round_trip(hb);
  EXPECT_TRUE(d.leaving);
  EXPECT_EQ(d.renew_rooms, hb.renew_rooms);
  hb.challenge = 77;
  d = round_trip(hb);
  EXPECT_TRUE(d.leaving);
  EXPECT_EQ(d.challenge, 77u);
  hb.renew_rooms.clear();
  d = round_trip(hb);
  EXPECT_TRUE(d.leaving && d.challenge == 77u && d.renew_rooms.empty());
}

TEST(CodecRenewal, LeavingIsLastAndOnce) {
  Heartbeat hb = renewal({});
  hb.leaving = true;
  std::string g = encode(Message(hb)) + std::string(1, char(4));  // twice
  fix_body_length(g);
  expect_rejected(g, "trailing");
  hb.renew_rooms = {3};
  g = encode(Message(hb));
  g[kTail + 1 + 4 + 8] = 3;  // a second renewal tag where leaving may stand
  expect_rejected(g, "Heartbeat.leaving");
  g = encode(Message(hb)) + std::string(8, '\0');  // bytes after leaving
  fix_body_length(g);
  expect_rejected(g, "trailing");
}

}  // namespace
}  // namespace kvferry
