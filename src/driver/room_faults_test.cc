#include "driver/room_faults.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

RankId rank(const char* s) { return *RankId::parse(s); }

TEST(RoomFaults, NoFaultAsksNothing) {
  const RoomFaults f(std::nullopt, rank("prefill/tp0"));
  EXPECT_FALSE(f.fail_here());
  EXPECT_FALSE(f.fail_transfer());
  EXPECT_FALSE(f.peers_silent());
  EXPECT_FALSE(f.silent_toward({rank("decode/tp0")}));
  EXPECT_FALSE(RoomFaults().fail_here());
}

TEST(RoomFaults, EachKindAsksOnlyItsRank) {
  const auto self = rank("prefill/tp1");
  EXPECT_TRUE(RoomFaults(fault_from_names("prefill_fail", "prefill/tp1"), self).fail_here());
  EXPECT_FALSE(RoomFaults(fault_from_names("prefill_fail", "prefill/tp0"), self).fail_here());
  // decode_fail never asks a prefill rank to fail, even if it named one.
  EXPECT_FALSE(RoomFaults(fault_from_names("decode_fail", "prefill/tp1"), self).fail_here());
  EXPECT_TRUE(RoomFaults(fault_from_names("decode_fail", "decode/tp0"), rank("decode/tp0")).fail_here());
  EXPECT_FALSE(RoomFaults(fault_from_names("prefill_fail", "decode/tp0"), rank("decode/tp0")).fail_here());

  const RoomFaults transfer(fault_from_names("transfer", "prefill/tp1"), self);
  EXPECT_TRUE(transfer.fail_transfer());
  EXPECT_FALSE(transfer.fail_here());
  EXPECT_FALSE(transfer.peers_silent());

  const RoomFaults timeout(fault_from_names("timeout", "prefill/tp1"), self);
  EXPECT_TRUE(timeout.peers_silent());
  EXPECT_FALSE(timeout.fail_transfer());
  EXPECT_FALSE(timeout.silent_toward({rank("decode/tp1")}));
}

TEST(RoomFaults, SilentTowardATimedOutPeer) {
  const auto self = rank("prefill/tp0/dp1");
  const RoomFaults f(fault_from_names("timeout", "decode/tp1/dp1"), self);
  EXPECT_FALSE(f.peers_silent());
  EXPECT_TRUE(f.silent_toward({rank("decode/tp0/dp1"), rank("decode/tp1/dp1")}));
  EXPECT_FALSE(f.silent_toward({rank("decode/tp0/dp1")}));
  EXPECT_FALSE(f.silent_toward({rank("decode/tp1")}));  // another DP group
  EXPECT_FALSE(f.silent_toward({}));
  // Only timeout makes a rank silent.
  EXPECT_FALSE(RoomFaults(fault_from_names("transfer", "decode/tp1/dp1"), self).silent_toward({rank("decode/tp1/dp1")}));
}

}  // namespace
}  // namespace kvferry
