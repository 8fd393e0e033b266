// PrefillEndpoint::on_renewal (prefill_renewal.cc) frame by frame, through on_message as the
// control socket hands frames in (endpoint_pair_test_util.h: a real prefill and decode rank): a
// renewal moves a held room's bootstrap deadline to bootstrap_timeout from now and never past
// renew_limit after the opening; a renewal naming an unknown room, from a rank that is no
// destination of the room, from a stale incarnation, or for a room whose metadata came, changes
// nothing (docs/security.md "Lease renewal").
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "endpoint/endpoint_pair_steps.h"

namespace kvferry {
namespace {

using testing::decode_rank0;
using testing::make_pair;
using testing::PairConfig;

Heartbeat renewal(const RankId& from, uint64_t incarnation, std::vector<uint64_t> rooms) {
  Heartbeat hb{from, 0, monotonic_ns(), incarnation};
  hb.renew_rooms = std::move(rooms);
  return hb;
}

PairConfig lease_config() {
  PairConfig cfg;
  cfg.prefill_deadlines.bootstrap_timeout_ms = 60'000;
  cfg.prefill_deadlines.renew_limit_ms = 150'000;
  return cfg;
}

TEST(PrefillRenewal, RefusedRenewalsChangeNothing) {
  auto p = make_pair(lease_config());
  ASSERT_TRUE(p);
  const uint64_t room = 0x7e1, unknown = 0x7e2;
  p->prefill().add_room(room, 64);
  const int64_t deadline0 = p->prefill().room(room)->bootstrap_deadline_ns;
  const uint64_t inc = p->dcore().incarnation();
  const size_t live0 = p->prefill().live_rooms();
  auto unchanged = [&] {
    const SenderRoom* r = p->prefill().room(room);
    return r && r->bootstrap_deadline_ns == deadline0 && r->renewals == 0 && r->state.get() == KVPoll::Bootstrapping &&
           p->prefill().room(unknown) == nullptr && p->prefill().live_rooms() == live0;
  };
  // A room this rank does not hold: nothing is created or renewed.
  p->prefill().on_message(renewal(decode_rank0(), inc, {unknown}));
  EXPECT_TRUE(unchanged());
  // A decode rank that is no destination of the room (another DP group; with one decode DP group
  // it is outside the plan, refused before on_renewal).
  p->prefill().on_message(renewal(RankId{Role::kDecode, 0, 0, 1}, inc, {room}));
  EXPECT_TRUE(unchanged());
  // A rank outside the plan (decode TP rank 1 of a TP 1 engine).
  p->prefill().on_message(renewal(RankId{Role::kDecode, 0, 1, 0}, inc, {room}));
  EXPECT_TRUE(unchanged());
  // The destination's earlier incarnation.
  p->prefill().on_message(renewal(decode_rank0(), inc - 1, {room}));
  EXPECT_TRUE(unchanged());
  // A prefill rank.
  p->prefill().on_message(renewal(RankId{Role::kPrefill, 0, 0, 0}, inc, {room}));
  EXPECT_TRUE(unchanged());

  // The destination itself renews: the deadline moves to the lease from now.
  const int64_t before = monotonic_ns();
  p->prefill().on_message(renewal(decode_rank0(), inc, {room, unknown}));
  const SenderRoom* r = p->prefill().room(room);
  ASSERT_TRUE(r);
  EXPECT_GE(r->bootstrap_deadline_ns, before + 60'000'000'000);
  EXPECT_GT(r->bootstrap_deadline_ns, deadline0);
  EXPECT_EQ(r->renewals, 1u);
  EXPECT_EQ(p->prefill().room(unknown), nullptr);
}

TEST(PrefillRenewal, NeverPastTheRenewLimitNorAfterTheMetadata) {
  PairConfig cfg = lease_config();
  cfg.prefill_deadlines.renew_limit_ms = 60'500;  // half a second beyond the first deadline
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x7e3;
  p->prefill().add_room(room, 64);
  const SenderRoom* r = p->prefill().room(room);
  ASSERT_TRUE(r);
  const uint64_t inc = p->dcore().incarnation();
  p->prefill().on_message(renewal(decode_rank0(), inc, {room}));
  EXPECT_LE(r->bootstrap_deadline_ns, r->created_ns + 60'500'000'000);
  EXPECT_GT(r->bootstrap_deadline_ns, r->created_ns + 60'000'000'000);
  // A room whose metadata came is no longer bound by the lease: a renewal leaves it alone.
  const uint64_t room2 = 0x7e4;
  testing::open_room(*p, room2, 64, {4, 5, 6, 7}, 2);
  const int64_t deadline2 = p->prefill().room(room2)->bootstrap_deadline_ns;
  p->prefill().on_message(renewal(decode_rank0(), inc, {room2}));
  EXPECT_EQ(p->prefill().room(room2)->bootstrap_deadline_ns, deadline2);
  EXPECT_EQ(p->prefill().room(room2)->renewals, 0u);
}

}  // namespace
}  // namespace kvferry
