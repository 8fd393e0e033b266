// DecodeDriver as the engine leader: the preallocation queue (FIFO admission, rejection of what
// can never fit, prealloc timeout), aborts, the per-step agreement over the ranks' reports, and a
// quarantined room's reclaim in lockstep over two ranks.
// Runs over the endpoint pair harness so an admitted room really sends its metadata.
#include "driver/decode_driver.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::EndpointPair;
using testing::PairConfig;

std::vector<Decision> ops_for(const std::vector<Decision>& ds, uint64_t room) {
  std::vector<Decision> out;
  for (const Decision& d : ds)
    if (d.room == room) out.push_back(d);
  return out;
}

DecodeDriverConfig config_of(const PairConfig& c) {
  return {c.tp_size, c.decode_deadlines.prealloc_timeout_ms, c.decode_deadlines.fault_timeout_ms};
}

class DecodeDriverTest : public ::testing::Test {
 protected:
  void make(const PairConfig& cfg = {}) {
    auto p = EndpointPair::create(cfg);
    ASSERT_TRUE(p.ok()) << p.status().str();
    pair_ = std::move(p).value();
    drv_ = std::make_unique<DecodeDriver>(pair_->dmanager(), config_of(cfg));
  }
  void TearDown() override {
    drv_.reset();
    pair_.reset();
  }
  std::vector<Decision> step(const std::map<uint64_t, std::vector<RoomReport>>& by_room,
                             std::vector<RouterRequest> reqs = {}, int64_t now_ns = 0) {
    auto ds = drv_->decide(by_room, std::move(reqs), now_ns ? now_ns : monotonic_ns(), &results_);
    for (const Decision& d : ds) drv_->apply(d);
    return ds;
  }
  RouterRequest req(uint64_t room, uint64_t pages) {
    RouterRequest r;
    r.room = room;
    r.input_tokens = pages * pair_->layout().page_size;
    return r;
  }
  uint64_t total_pages() const { return pair_->layout().num_pages; }
  std::map<uint64_t, std::vector<RoomReport>> own_reports() {
    std::map<uint64_t, std::vector<RoomReport>> by_room;
    for (RoomReport& r : drv_->reports(monotonic_ns())) by_room[r.room].push_back(r);
    return by_room;
  }

  std::unique_ptr<EndpointPair> pair_;
  std::unique_ptr<DecodeDriver> drv_;
  std::vector<RoomResult> results_;
};

TEST_F(DecodeDriverTest, AdmitsFifo) {
  make();
  ASSERT_GE(total_pages(), 8u);
  const uint64_t a = 0x3001, b = 0x3002, c = 0x3003;
  auto ds = step({}, {req(a, total_pages() - 2), req(b, 4), req(c, 1)});
  ASSERT_EQ(ds.size(), 3u);
  for (const Decision& d : ds) EXPECT_EQ(d.op, Decision::Op::kNew);

  ds = step({});
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].op, Decision::Op::kAdmit);
  EXPECT_EQ(ds[0].room, a);
  EXPECT_EQ(pair_->decode().poll(a), KVPoll::WaitingForInput);  // metadata went out
  EXPECT_EQ(pair_->decode().room(a)->kv_indices.size(), total_pages() - 2);

  // c would fit in the 2 free pages, but b is ahead of it: nobody overtakes.
  EXPECT_TRUE(step({}).empty());
  EXPECT_EQ(pair_->decode().poll(b), KVPoll::Bootstrapping);
  EXPECT_EQ(pair_->decode().poll(c), KVPoll::Bootstrapping);

  drv_->apply({Decision::Op::kRelease, a});  // a done: its pages return
  ds = step({});
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds[0].op, Decision::Op::kAdmit);
  EXPECT_EQ(ds[0].room, b);
  EXPECT_EQ(ds[1].op, Decision::Op::kAdmit);
  EXPECT_EQ(ds[1].room, c);
  // Lowest pages first, identical on every rank (deterministic allocator).
  EXPECT_EQ(pair_->decode().room(b)->kv_indices, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(pair_->decode().room(c)->kv_indices, (std::vector<uint64_t>{4}));
  EXPECT_NE(pair_->decode().room(b)->aux_index, pair_->decode().room(c)->aux_index);
}

TEST_F(DecodeDriverTest, RejectsWhatCanNeverFitWithoutBlockingTheQueue) {
  make();
  const uint64_t big = 0x3011, small = 0x3012;
  step({}, {req(big, total_pages() + 1), req(small, 2)});
  auto ds = step({});
  auto mine = ops_for(ds, big);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kFail);
  EXPECT_EQ(mine[0].code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(mine[0].origin, "decode/tp0");
  EXPECT_NE(mine[0].reason.find("can never fit"), std::string::npos) << mine[0].reason;
  auto other = ops_for(ds, small);
  ASSERT_EQ(other.size(), 1u);
  EXPECT_EQ(other[0].op, Decision::Op::kAdmit);

  auto reports = own_reports();
  ASSERT_EQ(reports[big].size(), 1u);
  EXPECT_EQ(reports[big][0].poll, KVPoll::Failed);
  EXPECT_TRUE(reports[big][0].drained);  // no metadata went out: nothing can write there
  ds = step({{big, reports[big]}});
  ASSERT_EQ(ops_for(ds, big).size(), 1u);
  EXPECT_EQ(ops_for(ds, big)[0].op, Decision::Op::kRelease);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_TRUE(results_[0].rejected);
  EXPECT_EQ(results_[0].code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(results_[0].origin, "decode/tp0");
}

TEST_F(DecodeDriverTest, PreallocTimeoutAfterItsDeadline) {
  PairConfig cfg;
  cfg.decode_deadlines.prealloc_timeout_ms = 100;
  make(cfg);
  const uint64_t hog = 0x3021, waiter = 0x3022;
  step({}, {req(hog, total_pages())});
  ASSERT_EQ(step({}).size(), 1u);  // hog admitted, the pool is full
  step({}, {req(waiter, 2)});
  EXPECT_TRUE(ops_for(step({}), waiter).empty());
  EXPECT_TRUE(ops_for(step({}, {}, monotonic_ns() + 50'000'000), waiter).empty());
  auto ds = step({}, {}, monotonic_ns() + 200'000'000);
  auto mine = ops_for(ds, waiter);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kFail);
  EXPECT_EQ(mine[0].code, ErrorCode::kPreallocTimeout);
  EXPECT_EQ(mine[0].origin, "decode/tp0");
  EXPECT_TRUE(ops_for(ds, hog).empty());  // the admitted room is not touched
  EXPECT_EQ(pair_->decode().poll(waiter), KVPoll::Failed);
  EXPECT_TRUE(ops_for(step({}, {}, monotonic_ns() + 400'000'000), waiter).empty());  // once
}

TEST_F(DecodeDriverTest, AbortFailsWithTheLeaderAsOriginAndTellsPrefill) {
  make();
  const uint64_t room = 0x3031;
  pair_->prefill().add_room(room, 2 * pair_->layout().page_size);
  step({}, {req(room, 2)});
  step({});  // admitted: metadata to prefill
  ASSERT_TRUE(pair_->pump_until([&] { return pair_->prefill().poll(room) == KVPoll::WaitingForInput; }, 2s));
  drv_->on_abort(room);
  auto ds = step({});
  auto mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kFail);
  EXPECT_EQ(mine[0].code, ErrorCode::kAborted);
  EXPECT_EQ(mine[0].origin, "decode/tp0");
  auto e = pair_->dcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->is_from_another_rank);
  ASSERT_TRUE(pair_->pump_until([&] { return pair_->prefill().poll(room) == KVPoll::Failed; }, 2s));
  auto f = pair_->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, ErrorCode::kAborted);
  EXPECT_EQ(f->origin.str(), "decode/tp0");
  EXPECT_TRUE(f->is_from_another_rank);

  // Released only once prefill confirmed (drained), then the pages are back.
  ASSERT_TRUE(pair_->pump_until([&] { return own_reports()[room][0].drained; }, 2s));
  ds = step(own_reports());
  ASSERT_EQ(ops_for(ds, room).size(), 1u);
  EXPECT_EQ(ops_for(ds, room)[0].op, Decision::Op::kRelease);
  EXPECT_FALSE(ops_for(ds, room)[0].quarantine);
  // The dropped receiver's room is released at the manager's next progress.
  ASSERT_TRUE(pair_->pump_until([&] { return drv_->leak_stats().live_rooms == 0; }, 2s));
  EXPECT_EQ(drv_->leak_stats().pages_in_use, 0u);
  EXPECT_EQ(drv_->leak_stats().records, 0u);
}

// Naive design: ranks decide alone; or the reduction keeps only the MIN state and loses who
// failed, so every rank logs "unknown reason from another rank". And the room's pages return to
// the pool while one rank's prefill peer may still write into them.
TEST_F(DecodeDriverTest, Defect10_RanksAgree) {
  make();
  const uint64_t room = 0x3041;
  step({}, {req(room, 3)});
  step({});  // admitted on this rank: pages 0..2
  ASSERT_EQ(drv_->leak_stats().pages_in_use, 3u + 1u);  // 3 pages + 1 aux slot

  RoomReport ok = own_reports()[room][0];
  ok.poll = KVPoll::Success;  // as if this rank had verified already
  RoomReport bad;
  bad.room = room;
  bad.tp_rank = 1;
  bad.poll = KVPoll::Failed;
  bad.has_failure = true;
  bad.code = ErrorCode::kTransferError;
  bad.origin = "decode/tp1";
  bad.reason = "aux write failed";
  bad.first_seen_ns = 5;
  auto ds = step({{room, {ok, bad}}});
  auto mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kFail);
  EXPECT_EQ(mine[0].origin, "decode/tp1");
  EXPECT_EQ(mine[0].code, ErrorCode::kTransferError);
  EXPECT_EQ(mine[0].reason, "aux write failed");
  auto e = pair_->dcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->origin.str(), "decode/tp1");
  EXPECT_TRUE(e->is_from_another_rank);

  // This rank is Failed now, but its prefill peer has not confirmed: not drained, no release.
  RoomReport own = own_reports()[room][0];
  EXPECT_EQ(own.poll, KVPoll::Failed);
  EXPECT_FALSE(own.drained);
  bad.drained = true;
  EXPECT_TRUE(ops_for(step({{room, {own, bad}}}), room).empty());
  // The other rank drained only by its deadline: the release quarantines the pages.
  own.drained = true;
  bad.quarantine = true;
  ds = step({{room, {own, bad}}});
  mine = ops_for(ds, room);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].op, Decision::Op::kRelease);
  EXPECT_TRUE(mine[0].quarantine);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].state, KVPoll::Failed);
  EXPECT_EQ(results_[0].origin, "decode/tp1");
  EXPECT_EQ(results_[0].ranks_failed, 2u);
  EXPECT_FALSE(results_[0].rejected);
  EXPECT_EQ(drv_->quarantined_pages(), 3u);
  // Quarantined pages are never handed out again: a room needing the whole pool cannot be admitted.
  const uint64_t next = 0x3042;
  step({}, {req(next, total_pages())});
  EXPECT_TRUE(ops_for(step({}), next).empty());
  EXPECT_EQ(drv_->leak_stats().pages_in_use, 0u);  // quarantine is not counted as a leak
}

// The fan-out (SiblingFailure) on a decode rank: a sibling's failure fails the room here at once,
// as from another rank with its origin and code unchanged, and this rank's endpoint tells its
// prefill sources as for any failure; it is not sent on. The agreement still releases the room.
TEST_F(DecodeDriverTest, SiblingFailureFailsTheRoomAndTellsPrefillWithoutAStep) {
  make();
  const uint64_t room = 0x4041;
  pair_->prefill().add_room(room, 2 * pair_->layout().page_size);
  step({}, {req(room, 2)});
  step({});  // admitted: metadata to prefill
  ASSERT_TRUE(pair_->pump_until([&] { return pair_->prefill().poll(room) == KVPoll::WaitingForInput; }, 2s));
  EXPECT_TRUE(drv_->take_failures_to_fan_out().empty());
  SiblingFailure f{room, 3, ErrorCode::kInjected, "decode/tp3", "injected decode failure", 777};
  ASSERT_TRUE(drv_->on_sibling_failure(f));
  auto e = pair_->dcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kInjected);
  EXPECT_EQ(e->origin.str(), "decode/tp3");
  EXPECT_EQ(e->first_seen_ns, 777);
  EXPECT_TRUE(e->is_from_another_rank);
  EXPECT_TRUE(drv_->take_failures_to_fan_out().empty());  // never sent on
  auto reps = own_reports();
  ASSERT_EQ(reps[room].size(), 1u);
  EXPECT_EQ(reps[room][0].poll, KVPoll::Failed);
  EXPECT_GT(reps[room][0].failed_ns, 0);
  // The prefill source learns it with no step in between.
  ASSERT_TRUE(pair_->pump_until([&] { return pair_->prefill().poll(room) == KVPoll::Failed; }, 2s));
  auto p = pair_->pcore().registry().get(room);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->origin.str(), "decode/tp3");
  EXPECT_EQ(p->code, ErrorCode::kInjected);

  // The agreement decides kFail with the same attribution, then releases the drained room.
  auto ds = step(own_reports());
  ASSERT_EQ(ops_for(ds, room).size(), 1u);
  EXPECT_EQ(ops_for(ds, room)[0].op, Decision::Op::kFail);
  EXPECT_EQ(ops_for(ds, room)[0].origin, "decode/tp3");
  EXPECT_EQ(ops_for(ds, room)[0].code, ErrorCode::kInjected);
  ASSERT_TRUE(pair_->pump_until([&] { return own_reports()[room][0].drained; }, 2s));
  ds = step(own_reports());
  ASSERT_EQ(ops_for(ds, room).size(), 1u);
  EXPECT_EQ(ops_for(ds, room)[0].op, Decision::Op::kRelease);
  ASSERT_EQ(results_.size(), 1u);
  EXPECT_EQ(results_[0].origin, "decode/tp3");
  // The dropped receiver's room is released at the manager's next progress.
  ASSERT_TRUE(pair_->pump_until([&] { return drv_->leak_stats().live_rooms == 0; }, 2s));
  EXPECT_EQ(drv_->leak_stats().pages_in_use, 0u);
  EXPECT_EQ(drv_->leak_stats().records, 0u);
}

// Quarantine -> reclaim, in lockstep over the two ranks of a TP 2 decode engine (each fed by its
// own prefill rank of a TP 2 prefill engine, whose writes of the room are held in flight): the room fails, both ranks pass
// the drain deadline, the release quarantines the same pages on both; when one rank's prefill
// confirms the drain the leader still waits; when both did, kReclaim frees the same pages and aux
// row on both ranks, the counters go down, and a room needing the whole pool gets identical pages.
TEST(DecodeDriverReclaim, QuarantineEndsOnEveryRankThenPagesAreReusedInLockstep) {
  std::vector<std::unique_ptr<EndpointPair>> pairs;
  std::vector<std::unique_ptr<DecodeDriver>> drvs;
  for (uint32_t tp = 0; tp < 2; ++tp) {
    PairConfig cfg;
    cfg.decode_deadlines.drain_timeout_ms = 200;
    cfg.tp_rank = tp;  // prefill/tp<tp> feeds decode/tp<tp>
    cfg.tp_size = 2;
    auto p = EndpointPair::create(cfg);
    ASSERT_TRUE(p.ok()) << p.status().str();
    pairs.push_back(std::move(p).value());
    drvs.push_back(std::make_unique<DecodeDriver>(pairs.back()->dmanager(), config_of(cfg)));
  }
  DecodeDriver& leader = *drvs[0];
  const uint64_t total = pairs[0]->layout().num_pages;
  ASSERT_EQ(pairs[1]->layout().num_pages, total);
  const uint32_t page_size = pairs[0]->layout().page_size;
  std::vector<RoomResult> results;
  // One step of the engine: every rank's reports to the leader, its decisions applied on every
  // rank in order (as EngineLoop does).
  auto engine_step = [&](std::vector<RouterRequest> reqs = {}) {
    std::map<uint64_t, std::vector<RoomReport>> by_room;
    for (auto& d : drvs) {
      for (RoomReport& r : d->reports(monotonic_ns())) by_room[r.room].push_back(r);
      for (RoomReport& r : d->reclaim_reports()) by_room[r.room].push_back(r);
    }
    auto ds = leader.decide(by_room, std::move(reqs), monotonic_ns(), &results);
    for (const Decision& d : ds)
      for (auto& drv : drvs) drv->apply(d);
    return ds;
  };
  auto pump_until = [&](const std::function<bool()>& pred) {
    return pairs[0]->pump_until(pred, 10s, [&] {
      for (size_t i = 0; i < pairs.size(); ++i) {
        pairs[i]->pump();
        drvs[i]->pump(monotonic_ns());
      }
    });
  };
  auto req = [&](uint64_t room, uint64_t pages) {
    RouterRequest r;
    r.room = room;
    r.input_tokens = pages * page_size;
    return r;
  };

  const uint64_t room = 0x5101;
  for (auto& p : pairs) {
    p->prefill().add_room(room, 3 * page_size);
    p->pcore().faults()->hold_room(room);
  }
  engine_step({req(room, 3)});
  ASSERT_EQ(ops_for(engine_step(), room).size(), 1u);  // kAdmit: the same pages on both ranks
  ASSERT_EQ(pairs[0]->decode().room(room)->kv_indices, pairs[1]->decode().room(room)->kv_indices);
  ASSERT_TRUE(pump_until([&] {
    return pairs[0]->prefill().poll(room) == KVPoll::WaitingForInput &&
           pairs[1]->prefill().poll(room) == KVPoll::WaitingForInput;
  }));
  for (auto& p : pairs) ASSERT_TRUE(p->send_chunk(room, 0, {0, 1, 2}, 1).ok());  // held in flight
  leader.on_abort(room);
  ASSERT_EQ(ops_for(engine_step(), room)[0].op, Decision::Op::kFail);

  // Past the drain deadline with the writes still held: released quarantined on both ranks.
  std::vector<Decision> rel;
  ASSERT_TRUE(pump_until([&] {
    rel = ops_for(engine_step(), room);
    return !rel.empty();
  }));
  ASSERT_EQ(rel.size(), 1u);
  EXPECT_EQ(rel[0].op, Decision::Op::kRelease);
  EXPECT_TRUE(rel[0].quarantine);
  for (auto& d : drvs) {
    EXPECT_EQ(d->quarantined_pages(), 3u);
    EXPECT_EQ(d->quarantined_aux_rows(), 1u);
    EXPECT_EQ(d->leak_stats().quarantined_pages, 4u);  // counted as leaked
    EXPECT_EQ(d->leak_stats().pages_in_use, 0u);
    EXPECT_EQ(d->quarantined_rooms(), 1u);
    EXPECT_TRUE(d->reclaim_reports().empty());
    EXPECT_TRUE(d->idle());
  }
  const uint64_t whole = 0x5102;
  engine_step({req(whole, total)});
  EXPECT_TRUE(ops_for(engine_step(), whole).empty());  // the quarantined pages are not handed out

  // Rank 0's prefill confirms the drain: rank 0 reports the reclaim, the leader waits for rank 1.
  pairs[0]->pcore().faults()->release_held(room);
  ASSERT_TRUE(pump_until([&] { return !drvs[0]->reclaim_reports().empty(); }));
  ASSERT_EQ(drvs[0]->reclaim_reports().size(), 1u);
  EXPECT_EQ(drvs[0]->reclaim_reports()[0].room, room);
  EXPECT_TRUE(drvs[0]->reclaim_reports()[0].reclaimed);
  pairs[1]->pump_for(50ms);
  EXPECT_TRUE(drvs[1]->reclaim_reports().empty());
  EXPECT_TRUE(ops_for(engine_step(), room).empty());
  EXPECT_EQ(drvs[0]->quarantined_pages(), 3u);

  // Rank 1's too: kReclaim, on both ranks, frees the same pages and aux row.
  pairs[1]->pcore().faults()->release_held(room);
  ASSERT_TRUE(pump_until([&] { return !drvs[1]->reclaim_reports().empty(); }));
  auto ds = engine_step();
  auto rc = ops_for(ds, room);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].op, Decision::Op::kReclaim);
  for (auto& d : drvs) {
    EXPECT_EQ(d->quarantined_pages(), 0u);
    EXPECT_EQ(d->quarantined_aux_rows(), 0u);
    EXPECT_EQ(d->quarantined_rooms(), 0u);
    EXPECT_EQ(d->reclaimed_pages(), 4u);
    EXPECT_EQ(d->reclaimed_rooms(), 1u);
    EXPECT_EQ(d->leak_stats().quarantined_pages, 0u);
    EXPECT_EQ(d->leak_stats().reclaimed_pages, 4u);
    EXPECT_TRUE(d->reclaim_reports().empty());
  }
  const auto next = engine_step();
  EXPECT_TRUE(ops_for(next, room).empty());  // once

  // The pool is whole again: the room waiting for every page is admitted (at the step after the
  // reclaim: admission counted the free pages before it), identically on both ranks.
  std::vector<Decision> admit = ops_for(ds, whole);
  EXPECT_TRUE(admit.empty());
  admit = ops_for(next, whole);
  ASSERT_EQ(admit.size(), 1u);
  EXPECT_EQ(admit[0].op, Decision::Op::kAdmit);
  const ReceiverRoom* a = pairs[0]->decode().room(whole);
  const ReceiverRoom* b = pairs[1]->decode().room(whole);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->kv_indices.size(), total);
  EXPECT_EQ(a->kv_indices, b->kv_indices);
  EXPECT_EQ(a->aux_index, b->aux_index);
  for (auto& d : drvs) EXPECT_EQ(d->leak_stats().pages_in_use, total + 1);
  drvs.clear();
}

}  // namespace
}  // namespace kvferry
