// PrefillDriver as the engine leader: decide() over the ranks' reports (the per-step agreement),
// aborts and down ranks. One caller-pumped Manager, no peer: decide() needs no transfer, and the
// rooms' senders stay before init() (decode's metadata never comes), as a prefill engine's
// bootstrap queue holds them. The manager's registry is read to check what the rank recorded.
#include "driver/prefill_driver.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"

namespace kvferry {
namespace {

using testing::prefill_rank0;

RoomReport rep(uint64_t room, uint32_t tp, KVPoll poll, bool drained) {
  RoomReport r;
  r.room = room;
  r.tp_rank = tp;
  r.poll = poll;
  r.drained = drained;
  return r;
}

RoomReport failed_rep(uint64_t room, uint32_t tp, bool drained, ErrorCode code, const std::string& origin,
                      int64_t first_seen_ns) {
  RoomReport r = rep(room, tp, KVPoll::Failed, drained);
  r.has_failure = true;
  r.code = code;
  r.origin = origin;
  r.reason = "failure at " + origin;
  r.first_seen_ns = first_seen_ns;
  r.failed_ns = first_seen_ns + 10;
  return r;
}

std::vector<Decision> ops_for(const std::vector<Decision>& ds, uint64_t room) {
  std::vector<Decision> out;
  for (const Decision& d : ds)
    if (d.room == room) out.push_back(d);
  return out;
}

class PrefillDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = testing::make_test_manager(prefill_rank0());
    ASSERT_TRUE(m.ok()) << m.status().str();
    manager_ = std::move(m).value();
    core_ = &internal(*manager_).core();
    drv_ = std::make_unique<PrefillDriver>(*manager_, PrefillDriverConfig{.chunk_pages = 4, .fault_timeout_ms = 1});
  }
  void TearDown() override {
    drv_.reset();
    manager_.reset();
  }
  // The leader's step: decide, then apply every decision (as every rank does).
  std::vector<Decision> step(const std::map<uint64_t, std::vector<RoomReport>>& by_room,
                             std::vector<RouterRequest> reqs = {}) {
    auto ds = drv_->decide(by_room, std::move(reqs), monotonic_ns(), &results_);
    for (const Decision& d : ds) drv_->apply(d);
    return ds;
  }
  void add(uint64_t room, uint64_t tokens, const std::string& fault_kind = "") {
    RouterRequest r;
    r.room = room;
    r.input_tokens = tokens;
    if (!fault_kind.empty()) r.fault = fault_from_names(fault_kind, prefill_rank0().str());
    auto ds = step({}, {r});
    ASSERT_EQ(ds.size(), 1u);
    ASSERT_EQ(ds[0].op, Decision::Op::kNew);
    ASSERT_TRUE(own(room));
  }
  // This rank's report of `room` (nullopt: the driver does not have it).
  std::optional<RoomReport> own(uint64_t room) {
    for (const RoomReport& r : drv_->reports(monotonic_ns()))
      if (r.room == room) return r;
    return std::nullopt;
  }
  // The manager released every room of a dropped sender (deferred to its progress).
  bool manager_empty() {
    for (int i = 0; i < 1000; ++i) {
      manager_->progress();
      if (manager_->stats().live_rooms == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  std::unique_ptr<Manager> manager_;
  EndpointCore* core_ = nullptr;  // manager_'s
  std::unique_ptr<PrefillDriver> drv_;
  std::vector<RoomResult> results_;
};

// Naive design: each rank decides on its own view; a rank that saw Success releases the room and
// moves on to the next collective while the failed rank waits in another one (deadlock), or the
// failed rank's cause is lost in the reduction ("unknown reason").
TEST_F(PrefillDriverTest, Defect10_RanksAgree) {
  const uint64_t room = 0x2001;
  add(room, 64);

  // One rank succeeded, the other failed: the engine fails the room with the failed rank's origin.
  auto ds = step({{room, {rep(room, 0, KVPoll::Success, true),
                          failed_rep(room, 1, true, ErrorCode::kTransferError, "prefill/tp1", 1000)}}});
  auto mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kFail);
  EXPECT_EQ(mine[0].code, ErrorCode::kTransferError);
  EXPECT_EQ(mine[0].origin, "prefill/tp1");
  EXPECT_EQ(mine[0].reason, "failure at prefill/tp1");
  EXPECT_EQ(mine[0].first_seen_ns, 1000);
  EXPECT_TRUE(results_.empty());
  // Every rank applied it: this rank's registry now holds the agreed, propagated cause.
  auto e = core_->registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->origin.str(), "prefill/tp1");
  EXPECT_TRUE(e->is_from_another_rank);
  EXPECT_EQ(own(room)->poll, KVPoll::Failed);

  // Not every rank Failed yet (a stale Success report): no release, and no second kFail.
  ds = step({{room, {rep(room, 0, KVPoll::Success, true),
                     failed_rep(room, 1, true, ErrorCode::kTransferError, "prefill/tp1", 1000)}}});
  EXPECT_TRUE(ops_for(ds, room).empty());
  // Every rank Failed, one not drained (a write of its own still in flight): still no release.
  ds = step({{room, {failed_rep(room, 0, false, ErrorCode::kTransferError, "prefill/tp1", 1000),
                     failed_rep(room, 1, true, ErrorCode::kTransferError, "prefill/tp1", 1000)}}});
  EXPECT_TRUE(ops_for(ds, room).empty());
  EXPECT_TRUE(own(room));

  // This rank's own report is Failed and drained; with the other rank's: release, one result.
  auto reps = drv_->reports(monotonic_ns());
  ASSERT_EQ(reps.size(), 1u);
  EXPECT_EQ(reps[0].poll, KVPoll::Failed);
  EXPECT_TRUE(reps[0].drained);
  EXPECT_EQ(reps[0].origin, "prefill/tp1");
  ds = step({{room, {reps[0], failed_rep(room, 1, true, ErrorCode::kTransferError, "prefill/tp1", 1000)}}});
  mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kRelease);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].state, KVPoll::Failed);
  EXPECT_EQ(results_[0].code, ErrorCode::kTransferError);
  EXPECT_EQ(results_[0].origin, "prefill/tp1");
  EXPECT_EQ(results_[0].ranks_failed, 2u);
  EXPECT_FALSE(own(room));
  EXPECT_TRUE(drv_->idle());
  EXPECT_TRUE(manager_empty());
  RankLeakStats leaks = drv_->leak_stats();
  EXPECT_EQ(leaks.live_rooms, 0u);
  EXPECT_EQ(leaks.records, 0u);
  EXPECT_EQ(leaks.pages_in_use, 0u);
}

TEST_F(PrefillDriverTest, EarliestFailureWinsAcrossRanks) {
  const uint64_t room = 0x2002;
  add(room, 32);
  auto ds = step({{room, {failed_rep(room, 0, true, ErrorCode::kPeerUnreachable, "decode/tp0", 2000),
                          failed_rep(room, 1, true, ErrorCode::kTransferError, "prefill/tp1", 1500)}}});
  auto mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kFail);
  EXPECT_EQ(mine[0].origin, "prefill/tp1");
  EXPECT_EQ(mine[0].code, ErrorCode::kTransferError);
}

TEST_F(PrefillDriverTest, StartOnlyWhenEveryRankHasItsMetadata) {
  const uint64_t room = 0x2003;
  add(room, 32);
  auto ds = step({{room, {rep(room, 0, KVPoll::WaitingForInput, false), rep(room, 1, KVPoll::Bootstrapping, false)}}});
  EXPECT_TRUE(ops_for(ds, room).empty());
  ds = step({{room, {rep(room, 0, KVPoll::WaitingForInput, false), rep(room, 1, KVPoll::WaitingForInput, false)}}});
  auto mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kStart);
  ds = step({{room, {rep(room, 0, KVPoll::Transferring, false), rep(room, 1, KVPoll::WaitingForInput, false)}}});
  EXPECT_TRUE(ops_for(ds, room).empty());  // started once
  ds = step({{room, {rep(room, 0, KVPoll::Success, true), rep(room, 1, KVPoll::Success, true)}}});
  mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kRelease);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].state, KVPoll::Success);
  EXPECT_EQ(results_[0].code, ErrorCode::kOk);
}

TEST_F(PrefillDriverTest, AbortFailsWithTheLeaderAsOrigin) {
  const uint64_t room = 0x2004;
  add(room, 32);
  drv_->on_abort(room);
  auto ds = step({});
  auto mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kFail);
  EXPECT_EQ(mine[0].code, ErrorCode::kAborted);
  EXPECT_EQ(mine[0].origin, "prefill/tp0");
  auto e = core_->registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kAborted);
  EXPECT_FALSE(e->is_from_another_rank);  // local on the leader, which received the abort

  drv_->on_abort(room);  // a second abort is no second failure
  EXPECT_TRUE(ops_for(step({}), room).empty());
  drv_->on_abort(0x9999);  // an unknown room is ignored
  EXPECT_TRUE(step({}).empty());

  auto reps = drv_->reports(monotonic_ns());
  ASSERT_EQ(reps.size(), 1u);
  ds = step({{room, reps}});
  ASSERT_EQ(ops_for(ds, room).size(), 1u);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].code, ErrorCode::kAborted);
  EXPECT_EQ(results_[0].origin, "prefill/tp0");
}

TEST_F(PrefillDriverTest, DownRankFailsItsRoomsWithItsOrigin) {
  const uint64_t room = 0x2005;
  add(room, 32);
  drv_->on_rank_down({Role::kPrefill, 0, 1, 0}, "no step reply for 1000 ms");
  auto ds = step({{room, {rep(room, 0, KVPoll::WaitingForInput, false)}}});
  auto mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kFail);
  EXPECT_EQ(mine[0].code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(mine[0].origin, "prefill/tp1");
  EXPECT_EQ(mine[0].reason, "no step reply for 1000 ms");
  // Released with this rank's report alone: the down rank is counted as lost, not as failed.
  auto reps = drv_->reports(monotonic_ns());
  ASSERT_EQ(reps.size(), 1u);
  EXPECT_EQ(reps[0].poll, KVPoll::Failed);
  step({{room, {reps[0]}}});
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].ranks_failed, 1u);
  EXPECT_EQ(results_[0].ranks_lost, 1u);
}

// The fan-out (SiblingFailure): a first-hand failure goes out once; one learned from a sibling
// fails the room here as from another rank and is never sent on; one from the agreement is not sent.
TEST_F(PrefillDriverTest, FanOutSendsFirstHandFailuresOnceAndNeverForwards) {
  add(1, 64, "timeout");  // this rank's bootstrap deadline cut to fault_timeout_ms (1 ms)
  add(2, 64);
  add(3, 64);
  const RankId self = prefill_rank0();
  const RankId decode1{Role::kDecode, 0, 1, 0};
  // Room 1: first-hand (decode's metadata did not come by the room's deadline).
  EXPECT_TRUE(drv_->take_failures_to_fan_out().empty());
  drv_->pump(monotonic_ns() + 1'000'000'000);
  auto out = drv_->take_failures_to_fan_out();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].room, 1u);
  EXPECT_EQ(out[0].tp_rank, self.tp_rank);
  EXPECT_EQ(out[0].code, ErrorCode::kBootstrapTimeout);
  EXPECT_EQ(out[0].origin, self.str());
  EXPECT_NE(out[0].reason.find("did not come within 1 ms"), std::string::npos) << out[0].reason;
  EXPECT_GT(out[0].first_seen_ns, 0);
  drv_->pump(monotonic_ns() + 2'000'000'000);
  EXPECT_TRUE(drv_->take_failures_to_fan_out().empty());  // once per room

  // Room 2: a sibling (tp1) tells us; origin and code unchanged, from another rank, not sent on.
  SiblingFailure f{2, 1, ErrorCode::kPeerUnreachable, decode1.str(), "decode tp1 died", 3000};
  EXPECT_TRUE(drv_->on_sibling_failure(f));
  auto e = core_->registry().get(2);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(e->origin, decode1);
  EXPECT_EQ(e->first_seen_ns, 3000);
  EXPECT_TRUE(e->is_from_another_rank);
  EXPECT_EQ(own(2)->poll, KVPoll::Failed);
  auto reps = drv_->reports(monotonic_ns());
  for (const RoomReport& r : reps) {
    if (r.room == 2) {
      EXPECT_GT(r.failed_ns, 0);
    }
  }
  EXPECT_TRUE(drv_->take_failures_to_fan_out().empty());
  // A second sibling's frame for a room that has a record: the registry keeps the root cause by
  // the rule (this one precedes: same window, prefill before decode), the first is superseded.
  SiblingFailure g{2, 2, ErrorCode::kInjected, self.str(), "other", 1};
  EXPECT_TRUE(drv_->on_sibling_failure(g));
  EXPECT_EQ(core_->registry().get(2)->code, ErrorCode::kInjected);
  ASSERT_EQ(core_->registry().get(2)->superseded.size(), 1u);
  EXPECT_EQ(core_->registry().get(2)->superseded[0].origin, decode1);
  EXPECT_TRUE(core_->registry().get(2)->is_from_another_rank);  // it came in a message
  SiblingFailure later{2, 2, ErrorCode::kInjected, decode1.str(), "later", 3000 + 20'000'000};
  EXPECT_TRUE(drv_->on_sibling_failure(later));  // a later window: it loses
  EXPECT_EQ(core_->registry().get(2)->failure_reason, "other");

  // Room 3: the agreement's kFail: every rank got it in the step, nothing to fan out.
  Decision d;
  d.op = Decision::Op::kFail;
  d.room = 3;
  d.code = ErrorCode::kAborted;
  d.origin = self.str();
  d.reason = "aborted by the router";
  d.first_seen_ns = 4000;
  drv_->apply(d);
  EXPECT_EQ(own(3)->poll, KVPoll::Failed);
  EXPECT_TRUE(drv_->take_failures_to_fan_out().empty());

  // A room this rank does not have: nothing changes, the caller keeps the frame.
  SiblingFailure unknown{99, 1, ErrorCode::kInjected, decode1.str(), "x", 5};
  EXPECT_FALSE(drv_->on_sibling_failure(unknown));
  EXPECT_FALSE(core_->registry().get(99).has_value());
}

}  // namespace
}  // namespace kvferry
