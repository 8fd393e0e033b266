// A prefill engine and a decode engine of one rank each, their drivers run step by step over the
// endpoint pair harness (what EngineLoop does, minus the sockets between an engine's ranks):
// requests end to end with back-pressure, and each fault kind attributed on both engines with
// exactly one log line above debug.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "driver/decode_driver.h"
#include "driver/prefill_driver.h"
#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::EndpointPair;
using testing::PairConfig;

std::map<uint64_t, std::vector<RoomReport>> by_room(std::vector<RoomReport> reps) {
  std::map<uint64_t, std::vector<RoomReport>> out;
  for (RoomReport& r : reps) out[r.room].push_back(std::move(r));
  return out;
}

class DriverPairTest : public ::testing::Test {
 protected:
  void make(PairConfig cfg = {}, PrefillDriverConfig pc = {4}) {
    auto p = EndpointPair::create(cfg);
    ASSERT_TRUE(p.ok()) << p.status().str();
    pair_ = std::move(p).value();
    pc.fault_timeout_ms = cfg.prefill_deadlines.fault_timeout_ms;
    prefill_ = std::make_unique<PrefillDriver>(pair_->pmanager(), pc);
    decode_ = std::make_unique<DecodeDriver>(
        pair_->dmanager(), DecodeDriverConfig{cfg.tp_size, cfg.decode_deadlines.prealloc_timeout_ms,
                                              cfg.decode_deadlines.fault_timeout_ms});
  }
  void TearDown() override {
    prefill_.reset();
    decode_.reset();
    pair_.reset();
  }
  // One step of both engines: the leader decides over its reports and applies; then local work.
  void step(const std::vector<RouterRequest>& reqs = {}) {
    int64_t now = monotonic_ns();
    for (const Decision& d : prefill_->decide(by_room(prefill_->reports(now)), reqs, now, &presults_))
      prefill_->apply(d);
    for (const Decision& d : decode_->decide(by_room(decode_->reports(now)), reqs, now, &dresults_))
      decode_->apply(d);
    pair_->pump();
    prefill_->pump(monotonic_ns());
    decode_->pump(monotonic_ns());
  }
  bool run_until_results(size_t n, std::chrono::milliseconds timeout) {
    return pair_->pump_until([&] { return presults_.size() >= n && dresults_.size() >= n; }, timeout,
                             [&] { step(); });
  }
  RouterRequest req(uint64_t room, uint64_t tokens, const std::string& fault_kind = "",
                    const std::string& fault_at = "") {
    RouterRequest r;
    r.room = room;
    r.input_tokens = tokens;
    if (!fault_kind.empty()) r.fault = fault_from_names(fault_kind, fault_at);
    return r;
  }
  const RoomResult* result(const std::vector<RoomResult>& rs, uint64_t room) {
    for (const RoomResult& r : rs)
      if (r.room == room) return &r;
    return nullptr;
  }
  void expect_no_leaks() {
    for (const RankLeakStats& s : {prefill_->leak_stats(), decode_->leak_stats()}) {
      EXPECT_EQ(s.live_rooms, 0u) << s.rank;
      EXPECT_EQ(s.records, 0u) << s.rank;
      EXPECT_EQ(s.pages_in_use, 0u) << s.rank;
      EXPECT_EQ(s.peers, 1u) << s.rank;
    }
    EXPECT_EQ(decode_->quarantined_pages(), 0u);
  }
  // Both engines report the room Failed with this code and origin.
  void expect_failed(uint64_t room, ErrorCode code, const std::string& origin) {
    for (const auto* rs : {&presults_, &dresults_}) {
      const RoomResult* r = result(*rs, room);
      ASSERT_NE(r, nullptr);
      EXPECT_EQ(r->state, KVPoll::Failed) << role_name(r->role);
      EXPECT_EQ(r->code, code) << role_name(r->role);
      EXPECT_EQ(r->origin, origin) << role_name(r->role);
      EXPECT_FALSE(r->reason.empty());
      EXPECT_EQ(r->ranks_failed, 1u);
    }
  }

  std::unique_ptr<EndpointPair> pair_;
  std::unique_ptr<PrefillDriver> prefill_;
  std::unique_ptr<DecodeDriver> decode_;
  std::vector<RoomResult> presults_, dresults_;
};

TEST_F(DriverPairTest, RequestsSucceedWithBackPressureAndNothingLeaks) {
  make();
  const uint64_t lines0 = lines_above_debug();
  const PoolLayout& l = pair_->layout();
  ASSERT_EQ(l.num_pages, 18u);
  // 7 + 3 + 13 pages: the last one waits until the first released its decode pages.
  std::vector<RouterRequest> reqs = {req(0x4001, 100), req(0x4002, 40), req(0x4003, 200)};
  step(reqs);
  ASSERT_TRUE(run_until_results(3, 10s)) << presults_.size() << " prefill / " << dresults_.size() << " decode";
  for (const RouterRequest& q : reqs) {
    const RoomResult* pr = result(presults_, q.room);
    const RoomResult* dr = result(dresults_, q.room);
    ASSERT_TRUE(pr && dr);
    uint64_t pages = l.pages_for(q.input_tokens);
    EXPECT_EQ(pr->state, KVPoll::Success);
    EXPECT_EQ(pr->bytes_transferred, l.bytes_for_pages(pages) + sizeof(AuxRecord));
    EXPECT_EQ(dr->state, KVPoll::Success);
    EXPECT_EQ(dr->bytes_verified, l.bytes_for_pages(pages));
    EXPECT_EQ(dr->bytes_mismatched, 0u);
  }
  expect_no_leaks();
  EXPECT_EQ(lines_above_debug(), lines0);
}

// The compute model (prefill_driver.h): chunks of 4 pages filled layer by layer, 0.2 ms a layer;
// with and without layer-wise sends every request arrives verified, and the prefill result carries
// the end of its last layer's compute, which decode's Success follows (the transfer tail).
TEST_F(DriverPairTest, ComputeModelRequestsArriveVerifiedLayerwiseOrNot) {
  for (bool layerwise : {false, true}) {
    SCOPED_TRACE(layerwise ? "layer-wise" : "whole chunks");
    PrefillDriverConfig pc{4};
    pc.ms_per_layer = 0.2;
    pc.layerwise = layerwise;
    make({}, pc);
    const uint64_t lines0 = lines_above_debug();
    const PoolLayout& l = pair_->layout();
    std::vector<RouterRequest> reqs = {req(0x4101, 100), req(0x4102, 16)};  // 7 pages (2 chunks), 1 page
    step(reqs);
    ASSERT_TRUE(run_until_results(2, 20s)) << presults_.size() << " prefill / " << dresults_.size() << " decode";
    for (const RouterRequest& q : reqs) {
      const RoomResult* pr = result(presults_, q.room);
      const RoomResult* dr = result(dresults_, q.room);
      ASSERT_TRUE(pr && dr);
      const uint64_t pages = l.pages_for(q.input_tokens);
      EXPECT_EQ(pr->state, KVPoll::Success);
      EXPECT_EQ(pr->bytes_transferred, l.bytes_for_pages(pages) + sizeof(AuxRecord)) << "each layer once";
      EXPECT_EQ(dr->state, KVPoll::Success);
      EXPECT_EQ(dr->bytes_verified, l.bytes_for_pages(pages));
      EXPECT_EQ(dr->bytes_mismatched, 0u);
      EXPECT_GT(pr->compute_end_ns, 0);
      EXPECT_GE(dr->success_ns, pr->compute_end_ns) << "the last layer goes out after its compute";
    }
    expect_no_leaks();
    EXPECT_EQ(lines_above_debug(), lines0);
    TearDown();
    presults_.clear();
    dresults_.clear();
  }
}

TEST_F(DriverPairTest, LayerwiseTransferFaultFailsTheRoomCleanly) {
  PrefillDriverConfig pc{4};
  pc.ms_per_layer = 0.1;
  pc.layerwise = true;
  make({}, pc);
  const uint64_t lines0 = lines_above_debug();
  step({req(0x4111, 100, "transfer", "prefill/tp0"), req(0x4112, 64)});
  ASSERT_TRUE(run_until_results(2, 20s)) << presults_.size() << " prefill / " << dresults_.size() << " decode";
  expect_failed(0x4111, ErrorCode::kTransferError, "prefill/tp0");
  EXPECT_EQ(result(dresults_, 0x4112)->state, KVPoll::Success);
  EXPECT_EQ(result(dresults_, 0x4112)->bytes_mismatched, 0u);
  expect_no_leaks();
  EXPECT_EQ(lines_above_debug() - lines0, 1u);
}

TEST_F(DriverPairTest, TransferFaultAttributedToPrefillWithOneLine) {
  make();
  const uint64_t lines0 = lines_above_debug();
  step({req(0x4011, 64, "transfer", "prefill/tp0"), req(0x4012, 64)});
  ASSERT_TRUE(run_until_results(2, 5s)) << presults_.size() << " prefill / " << dresults_.size() << " decode";
  expect_failed(0x4011, ErrorCode::kTransferError, "prefill/tp0");
  EXPECT_EQ(result(dresults_, 0x4012)->state, KVPoll::Success);  // the other room is unaffected
  EXPECT_EQ(result(dresults_, 0x4012)->bytes_mismatched, 0u);
  expect_no_leaks();
  EXPECT_EQ(lines_above_debug() - lines0, 1u);  // prefill's warning; decode logs it at debug
}

TEST_F(DriverPairTest, DecodeFailureAttributedToDecodeWithOneLine) {
  make();
  const uint64_t lines0 = lines_above_debug();
  step({req(0x4021, 64, "decode_fail", "decode/tp0")});
  ASSERT_TRUE(run_until_results(1, 5s));
  expect_failed(0x4021, ErrorCode::kInjected, "decode/tp0");
  expect_no_leaks();
  EXPECT_EQ(lines_above_debug() - lines0, 1u);  // decode's error; prefill logs it at debug
}

// docs/design.md §4 defect 3: an abort is logged at info once, on the rank that received it, not as a
// transfer failure on every rank.
TEST_F(DriverPairTest, Defect3_AbortIsLoggedOnceAtInfo) {
  make();
  const uint64_t room = 0x4031;
  const uint64_t lines0 = lines_above_debug();
  step({req(room, 64)});
  ASSERT_TRUE(pair_->pump_until([&] { return pair_->decode().poll(room) != KVPoll::Bootstrapping; }, 2s,
                                [&] { step(); }));
  decode_->on_abort(room);
  ASSERT_TRUE(run_until_results(1, 5s));
  expect_failed(room, ErrorCode::kAborted, "decode/tp0");
  expect_no_leaks();
  EXPECT_EQ(lines_above_debug() - lines0, 1u);
}

TEST_F(DriverPairTest, Defect5_TimeoutFaultEndsBothSides) {
  PairConfig cfg;
  cfg.decode_deadlines.fault_timeout_ms = 100;
  make(cfg);
  const uint64_t lines0 = lines_above_debug();
  const int64_t t0 = monotonic_ns();
  step({req(0x4041, 64, "timeout", "decode/tp0")});  // prefill stays silent; decode times out
  ASSERT_TRUE(run_until_results(1, 5s));
  EXPECT_GE(monotonic_ns() - t0, 100'000'000);
  expect_failed(0x4041, ErrorCode::kWaitingTimeout, "decode/tp0");
  expect_no_leaks();
  EXPECT_EQ(lines_above_debug() - lines0, 1u);
}

}  // namespace
}  // namespace kvferry
