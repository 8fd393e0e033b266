#include "replay/peer_death_frames.h"

#include <gtest/gtest.h>

namespace kvferry::replay {
namespace {

TEST(PeerDeathFrames, RoundTrip) {
  auto k = decode_peer_death_frame(encode_peer_death("kill", "prefill/tp1", 0, ""));
  ASSERT_TRUE(k.ok() && k->has_value()) << k.status().str();
  EXPECT_EQ((*k)->type, "kill");
  EXPECT_EQ((*k)->rank, "prefill/tp1");
  auto d = decode_peer_death_frame(encode_peer_death("killed", "decode/tp0", 987654321, ""));
  ASSERT_TRUE(d.ok() && d->has_value());
  EXPECT_EQ((*d)->time_ns, 987654321);
  auto r = decode_peer_death_frame(encode_peer_death("restarted", "decode/tp0/dp1", 5, ""));
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->type, "restarted");
  EXPECT_EQ((*r)->rank, "decode/tp0/dp1");
  EXPECT_EQ((*r)->time_ns, 5);
  auto x = decode_peer_death_frame(encode_peer_death("kill_failed", "decode/tp0", 0, "not running"));
  ASSERT_TRUE(x.ok() && x->has_value());
  EXPECT_EQ((*x)->reason, "not running");
}

TEST(PeerDeathFrames, OtherFramesAreNotPeerDeaths) {
  auto f = decode_peer_death_frame(R"({"type":"result","room":"5"})");
  ASSERT_TRUE(f.ok()) << f.status().str();
  EXPECT_FALSE(f->has_value());
}

TEST(PeerDeathFrames, RejectsBadFrames) {
  EXPECT_FALSE(decode_peer_death_frame("").ok());
  EXPECT_FALSE(decode_peer_death_frame("[1]").ok());
  EXPECT_FALSE(decode_peer_death_frame(R"({"rank":"decode/tp0"})").ok());
  EXPECT_FALSE(decode_peer_death_frame(R"({"type":"kill","rank":"gpu3"})").ok());
  EXPECT_FALSE(decode_peer_death_frame(R"({"type":"killed","rank":"decode/tp0"})").ok());  // no time
  EXPECT_FALSE(decode_peer_death_frame(R"({"type":"killed","rank":"decode/tp0","time_ns":1.5})").ok());
  EXPECT_FALSE(
      decode_peer_death_frame(R"({"type":"killed","rank":"decode/tp0","time_ns":18446744073709551615})").ok());
  EXPECT_FALSE(decode_peer_death_frame(R"({"type":"kill_failed","rank":"decode/tp0"})").ok());
}

}  // namespace
}  // namespace kvferry::replay
