#include "kvferry/state.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

constexpr KVPoll F = KVPoll::Failed, B = KVPoll::Bootstrapping, W = KVPoll::WaitingForInput,
                 T = KVPoll::Transferring, S = KVPoll::Success;

// Every row of the table, written out independently of state.cc.
TEST(StateTable, FailedIsTerminal) {
  EXPECT_TRUE(transition_allowed(F, F));
  EXPECT_FALSE(transition_allowed(F, B));
  EXPECT_FALSE(transition_allowed(F, W));
  EXPECT_FALSE(transition_allowed(F, T));
  EXPECT_FALSE(transition_allowed(F, S));
}

TEST(StateTable, Bootstrapping) {
  EXPECT_TRUE(transition_allowed(B, F));
  EXPECT_TRUE(transition_allowed(B, B));
  EXPECT_TRUE(transition_allowed(B, W));
  EXPECT_FALSE(transition_allowed(B, T));
  EXPECT_FALSE(transition_allowed(B, S));
}

TEST(StateTable, WaitingForInput) {
  EXPECT_TRUE(transition_allowed(W, F));
  EXPECT_FALSE(transition_allowed(W, B));
  EXPECT_TRUE(transition_allowed(W, W));
  EXPECT_TRUE(transition_allowed(W, T));
  EXPECT_TRUE(transition_allowed(W, S));  // data landed between two polls
}

TEST(StateTable, Transferring) {
  EXPECT_TRUE(transition_allowed(T, F));
  EXPECT_FALSE(transition_allowed(T, B));
  EXPECT_FALSE(transition_allowed(T, W));
  EXPECT_TRUE(transition_allowed(T, T));
  EXPECT_TRUE(transition_allowed(T, S));
}

TEST(StateTable, SuccessIsTerminal) {
  EXPECT_FALSE(transition_allowed(S, F));
  EXPECT_FALSE(transition_allowed(S, B));
  EXPECT_FALSE(transition_allowed(S, W));
  EXPECT_FALSE(transition_allowed(S, T));
  EXPECT_TRUE(transition_allowed(S, S));
}

TEST(StateTable, OutOfRangeValuesAreRejected) {
  EXPECT_FALSE(transition_allowed(static_cast<KVPoll>(7), S));
  EXPECT_FALSE(transition_allowed(B, static_cast<KVPoll>(-1)));
}

TEST(RoomState, HappyPathAndTerminal) {
  RoomState r;
  EXPECT_EQ(r.get(), B);
  EXPECT_FALSE(r.terminal());
  EXPECT_FALSE(r.advance(S));
  EXPECT_EQ(r.get(), B);
  EXPECT_TRUE(r.advance(W));
  EXPECT_TRUE(r.advance(T));
  EXPECT_TRUE(r.advance(T));
  EXPECT_TRUE(r.advance(S));
  EXPECT_TRUE(r.terminal());
  EXPECT_FALSE(r.advance(F));
  EXPECT_EQ(r.get(), S);
}

TEST(RoomState, FailedStaysFailed) {
  RoomState r;
  ASSERT_TRUE(r.advance(W));
  ASSERT_TRUE(r.advance(F));
  EXPECT_TRUE(r.terminal());
  EXPECT_FALSE(r.advance(T));
  EXPECT_FALSE(r.advance(S));
  EXPECT_EQ(r.get(), F);
}

TEST(Poll, NamesAndInts) {
  EXPECT_EQ(to_string(W), "WaitingForInput");
  for (int v = 0; v <= 4; ++v) {
    auto p = poll_from_int(v);
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(static_cast<int>(*p), v);
    EXPECT_EQ(poll_from_string(to_string(*p)), p);
  }
  EXPECT_FALSE(poll_from_int(5).has_value());
  EXPECT_FALSE(poll_from_int(-1).has_value());
  EXPECT_FALSE(poll_from_string("success").has_value());
}

}  // namespace
}  // namespace kvferry
