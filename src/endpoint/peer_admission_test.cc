// Issue 31 (docs/security.md, "Checked without the secret"): what a prefill rank refuses from a
// peer before it changes anything. Identities outside the plan, a changed registration under a
// live incarnation, a restart claimed by a heartbeat, a registration from the far future, and a
// restart claim while the old incarnation is alive: each refused (counted by kind), the live
// decode peer kept, and a room still transfers.
#include <gtest/gtest.h>

#include <chrono>

#include "endpoint/endpoint_pair_steps.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::decode_rank0;
using testing::make_pair;
using testing::transfer_room;

PoolRegistration registration_as(const RankId& sender, uint64_t incarnation, const std::string& endpoint) {
  PoolRegistration r;
  r.sender = sender;
  r.incarnation = incarnation;
  r.control_endpoint = endpoint;
  r.worker_address = std::string(64, '\x5a');
  r.spans = {RegionSpan{0, 1 << 20, 0x10000, "k"}};
  return r;
}

TEST(PeerAdmission, IdentitiesOutsideThePlanAreRefusedFirst) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->prefill().in_plan(decode_rank0()));
  // Another decode engine_id is another decode instance (admitted since issue 34d): its TP rank
  // outside the plan is refused as engine 0's is.
  for (const RankId& r : {RankId{Role::kDecode, 0, 200, 0}, RankId{Role::kDecode, 4, 200, 0},
                          RankId{Role::kDecode, 0, 0, 1}, RankId{Role::kPrefill, 0, 0, 0}}) {
    SCOPED_TRACE(r.str());
    EXPECT_FALSE(p->prefill().in_plan(r));
    p->prefill().on_message(Message(registration_as(r, 0, "tcp://127.0.0.1:1")));
    p->prefill().on_message(Message(Heartbeat{r, 1, 0, 1ull << 63}));
  }
  EXPECT_EQ(p->pcore().refusals().count(Refusal::kOutsidePlan), 8u);
  EXPECT_EQ(p->prefill().peers(), 1u);
  EXPECT_EQ(p->prefill().refused_registrations(), 0u);  // never got as far as the shape check
  EXPECT_FALSE(p->decode().in_plan(RankId{Role::kPrefill, 0, 1, 0}));
  EXPECT_FALSE(p->decode().admits(RankId{Role::kDecode, 0, 0, 0}));
  EXPECT_EQ(p->dcore().refusals().count(Refusal::kOutsidePlan), 1u);
  transfer_room(*p, 0x3101, 32, {0, 1}, 1);
  EXPECT_EQ(p->prefill().poll(0x3101), KVPoll::Success);
}

TEST(PeerAdmission, RegistrationsAndHeartbeatsThatWouldCutTheLivePeerOffChangeNothing) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t inc = p->dcore().incarnation();
  const std::optional<PeerId> before = p->prefill().transport_peer(decode_rank0());
  ASSERT_TRUE(before);
  // The live incarnation with another pool: refused, no connect started.
  p->prefill().on_message(Message(registration_as(decode_rank0(), inc, p->dcore().control_endpoint())));
  EXPECT_EQ(p->pcore().refusals().count(Refusal::kChangedRegistration), 1u);
  // A restart claimed by a heartbeat, and by metadata: not believed.
  p->prefill().on_message(Message(Heartbeat{decode_rank0(), 1, 0, inc + 1}));
  p->prefill().on_message(Message(RoomMetadata{0x77, decode_rank0(), {0}, 0, {}, 1, 1ull << 63, 0}));
  EXPECT_EQ(p->pcore().refusals().count(Refusal::kUnconfirmedRestart), 2u);
  // From an hour ahead of this rank's clock: refused.
  p->prefill().on_message(Message(registration_as(
      decode_rank0(), static_cast<uint64_t>(realtime_ns()) + 3'600'000'000'000ull, "tcp://127.0.0.1:1")));
  EXPECT_EQ(p->pcore().refusals().count(Refusal::kFutureIncarnation), 1u);
  // A plausible restart (the rank's own pool shape) naming another endpoint while the old one still
  // accepts: held.
  PoolRegistration claim = testing::decode_registration(*p);
  claim.incarnation = inc + 1;
  claim.control_endpoint = "tcp://127.0.0.1:1";
  claim.worker_address = std::string(64, '\x5a');
  p->prefill().on_message(Message(claim));
  EXPECT_EQ(p->pcore().refusals().count(Refusal::kUnconfirmedRestart), 3u);
  EXPECT_EQ(p->prefill().pending_restarts(), 1u);
  EXPECT_EQ(p->prefill().connecting_peers(), 0u);
  EXPECT_EQ(p->prefill().transport_peer(decode_rank0()), before);
  EXPECT_EQ(p->pcore().incarnation_counts().peer_restarts, 0u);
  EXPECT_EQ(p->pcore().incarnation_counts().stale_total(), 0u);
  // The real rank's frames still count: a room goes through on the same connection.
  transfer_room(*p, 0x3102, 32, {0, 1}, 1);
  EXPECT_EQ(p->prefill().poll(0x3102), KVPoll::Success);
  EXPECT_EQ(p->prefill().transport_peer(decode_rank0()), before);
}

}  // namespace
}  // namespace kvferry
