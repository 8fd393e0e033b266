#include "replay/peer_death_schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvferry::replay {
namespace {

PeerDeathFrame frame(const std::string& type, const std::string& rank, int64_t ns) {
  return PeerDeathFrame{type, rank, ns, ""};
}

TEST(PeerDeathSchedule, FollowerKilledRestartedAndProvenBack) {
  PeerDeathSchedule s({{"decode/tp1", 3}});
  EXPECT_FALSE(s.kill_due(2, true));
  EXPECT_FALSE(s.kill_due(3, false));  // nothing in flight at its engine: the kill would fail nothing
  EXPECT_TRUE(s.kill_due(3, true));
  EXPECT_FALSE(s.settled(0, 10));
  std::vector<std::string> asked;
  auto ask = [&](const std::string& f) {
    asked.push_back(f);
    return Status::Ok();
  };
  ASSERT_TRUE(s.advance(1000, 2, true, 10, 2, 180, ask).ok());
  EXPECT_TRUE(asked.empty());  // not due yet
  ASSERT_TRUE(s.advance(1000, 3, false, 10, 3, 180, ask).ok());
  EXPECT_TRUE(asked.empty());  // due, but no room in flight at decode
  EXPECT_FALSE(s.paused());
  ASSERT_TRUE(s.advance(1000, 4, true, 10, 4, 180, ask).ok());
  ASSERT_EQ(asked.size(), 1u);
  auto f = decode_peer_death_frame(asked[0]);
  ASSERT_TRUE(f.ok() && f->has_value());
  EXPECT_EQ((*f)->type, "kill");
  EXPECT_EQ((*f)->rank, "decode/tp1");
  ASSERT_NE(s.current(), nullptr);
  EXPECT_EQ(s.current()->state, Death::State::kRequested);
  EXPECT_FALSE(s.kill_due(5, true));
  EXPECT_TRUE(s.paused());  // from the request until the rank is back in its engine
  s.on_rank_up(*RankId::parse("decode/tp1"));  // before the kill: an old rejoin, not the restart
  EXPECT_FALSE(s.current()->back);
  s.on_frame(frame("killed", "decode/tp1", 2000), 4);
  EXPECT_EQ(s.current()->state, Death::State::kKilled);
  EXPECT_EQ(s.current()->killed_ns, 2000);
  EXPECT_TRUE(s.paused());
  s.on_frame(frame("restarted", "decode/tp1", 3000), 4);
  EXPECT_EQ(s.current()->state, Death::State::kRestarted);
  EXPECT_EQ(s.current()->proven_after, 4u);
  EXPECT_TRUE(s.paused());  // started again, not yet taken back by its leader
  s.on_rank_up(*RankId::parse("decode/tp0"));  // another rank: nothing
  s.on_rank_up(*RankId::parse("prefill/tp1"));
  EXPECT_TRUE(s.paused());
  s.on_rank_up(*RankId::parse("decode/tp1"));
  EXPECT_TRUE(s.current()->back);
  EXPECT_FALSE(s.paused());
  s.on_success(3);  // dispatched before the restart: proves nothing
  ASSERT_NE(s.current(), nullptr);
  s.on_success(4);
  EXPECT_EQ(s.current(), nullptr);
  EXPECT_TRUE(s.settled(6, 10));
}

TEST(PeerDeathSchedule, FollowerBackBeforeTheRestartFrame) {
  // The leader's rank_up may overtake the orchestrator's "restarted": dispatch resumes only with both.
  PeerDeathSchedule s({{"prefill/tp1", 0}});
  ASSERT_TRUE(s.advance(0, 0, true, 4, 0, 180, [](const std::string&) { return Status::Ok(); }).ok());
  s.on_frame(frame("killed", "prefill/tp1", 10), 1);
  s.on_rank_up(*RankId::parse("prefill/tp1"));
  EXPECT_TRUE(s.current()->back);
  EXPECT_TRUE(s.paused());
  s.on_frame(frame("restarted", "prefill/tp1", 20), 1);
  EXPECT_FALSE(s.paused());
}

TEST(PeerDeathSchedule, LeaderPausesUntilDoneAndTimesOut) {
  PeerDeathSchedule s({{"prefill/tp0", 1}});
  EXPECT_FALSE(s.paused());  // planned: not yet
  auto ok = [](const std::string&) { return Status::Ok(); };
  ASSERT_TRUE(s.advance(0, 1, true, 4, 1, 2.0, ok).ok());
  EXPECT_TRUE(s.paused());
  EXPECT_TRUE(s.current()->leader());
  s.on_rank_up(*RankId::parse("prefill/tp0"));  // a leader comes back with "ready", not rank_up
  EXPECT_TRUE(s.paused());
  EXPECT_TRUE(s.advance(2'000'000'000, 1, true, 4, 1, 2.0, ok).ok());  // exactly the timeout: not past it
  Status late = s.advance(2'000'000'001, 1, true, 4, 1, 2.0, ok);
  EXPECT_EQ(late.code(), ErrorCode::kWaitingTimeout);
  EXPECT_NE(late.message().find("prefill/tp0"), std::string::npos) << late.message();
}

TEST(PeerDeathSchedule, FailuresAndSkips) {
  // The orchestrator cannot be asked: the error names it, the death stays planned.
  PeerDeathSchedule a({{"decode/tp0", 0}});
  Status st = a.advance(0, 0, true, 2, 0, 180, [](const std::string&) {
    return Status{ErrorCode::kPeerUnreachable, "queue full"};
  });
  EXPECT_EQ(st.code(), ErrorCode::kPeerUnreachable);
  EXPECT_NE(st.message().find("cannot ask the orchestrator"), std::string::npos);
  EXPECT_EQ(a.current()->state, Death::State::kPlanned);
  // A frame for another rank, or before the request, is ignored.
  a.on_frame(frame("killed", "decode/tp0", 5), 0);
  EXPECT_EQ(a.current()->state, Death::State::kPlanned);
  // kill_failed ends the death.
  PeerDeathSchedule b({{"decode/tp0", 0}, {"prefill/tp1", 5}});
  ASSERT_TRUE(b.advance(0, 0, true, 8, 0, 180, [](const std::string&) { return Status::Ok(); }).ok());
  b.on_frame(frame("killed", "prefill/tp1", 5), 0);
  EXPECT_EQ(b.current()->rank.str(), "decode/tp0");
  b.on_frame(PeerDeathFrame{"kill_failed", "decode/tp0", 0, "not running"}, 0);
  ASSERT_NE(b.current(), nullptr);
  EXPECT_EQ(b.current()->rank.str(), "prefill/tp1");
  // Every request finished before the next kill was due: it is skipped.
  EXPECT_TRUE(b.settled(8, 8));
  EXPECT_EQ(b.current(), nullptr);
}

}  // namespace
}  // namespace kvferry::replay
