// Incarnations (kvferry/messages.h, docs/failure-model.md "Incarnations"): a rank restarted on the
// same address and ports is found again by its peer, and nothing meant for its previous
// incarnation reaches it; stale registrations, statuses and metadata are refused and counted.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "endpoint/endpoint_pair_steps.h"
#include "kvferry/bootstrap.h"
#include "kvferry/log.h"
#include "kvferry/port_file.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::decode_rank0;
using testing::decode_registration;
using testing::EndpointPair;
using testing::make_pair;
using testing::PairConfig;
using testing::open_room;
using testing::prefill_rank0;
using testing::transfer_room;

uint16_t control_port(EndpointCore& core) { return endpoint_port(core.control_endpoint()).value_or(0); }

TEST(Incarnation, EveryRankHasOneAndALaterOneIsLarger) {
  const uint64_t a = next_incarnation();
  const uint64_t b = next_incarnation();
  EXPECT_GT(a, 0u);
  EXPECT_GT(b, a);  // unique within the process even within one clock tick
  EXPECT_GE(a, static_cast<uint64_t>(realtime_ns()) - 60'000'000'000ull);  // the start time, in ns
}

TEST(Incarnation, PrefillRefusesAndCountsStaleMetadataAndStatuses) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x2101;
  p->prefill().add_room(room, 32);  // 2 pages, no metadata yet
  const uint64_t decode_inc = p->dcore().incarnation();
  const uint64_t prefill_inc = p->pcore().incarnation();

  // From an older incarnation of the decode rank: refused, the room still waits.
  RoomMetadata md{room, decode_rank0(), {0, 1}, 0, {}, 1};
  md.incarnation = decode_inc - 1;
  md.peer_incarnation = prefill_inc;
  p->prefill().on_message(Message(md));
  // Meant for an earlier incarnation of this prefill rank: refused too.
  md.incarnation = decode_inc;
  md.peer_incarnation = prefill_inc - 7;
  p->prefill().on_message(Message(md));
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Bootstrapping);
  EXPECT_EQ(p->pcore().incarnation_counts().stale_metadata, 2u);

  RoomStatus st{room, decode_rank0(), KVPoll::Failed,
                Failure{ErrorCode::kAborted, decode_rank0(), "stale abort", monotonic_ns(), realtime_ns()}};
  st.incarnation = decode_inc - 1;
  st.peer_incarnation = prefill_inc;
  p->prefill().on_message(Message(st));
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Bootstrapping);  // nothing of the old one applies
  EXPECT_FALSE(p->pcore().registry().get(room));
  EXPECT_EQ(p->pcore().incarnation_counts().stale_statuses, 1u);
  EXPECT_EQ(p->pcore().incarnation_counts().stale_total(), 3u);
  EXPECT_EQ(p->pcore().incarnation_counts().peer_restarts, 0u);

  // The current incarnation's metadata is used.
  md.peer_incarnation = prefill_inc;
  p->prefill().on_message(Message(md));
  // Ready once the transport connect to the decode rank (off the engine thread) completed too.
  EXPECT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::WaitingForInput; },
                            std::chrono::seconds(5)));
}

TEST(Incarnation, PrefillRefusesAStaleRegistrationAndKeepsThePeer) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  ASSERT_EQ(p->prefill().peers(), 1u);
  const uint64_t refused0 = p->prefill().refused_registrations();
  // A registration from an older incarnation of decode/tp0 (e.g. delayed in the network).
  PoolRegistration old;
  old.sender = decode_rank0();
  old.incarnation = p->dcore().incarnation() - 1;
  old.peer_incarnation = p->pcore().incarnation();
  old.control_endpoint = "tcp://127.0.0.1:1";  // never used: refused before anything
  p->prefill().on_message(Message(old));
  EXPECT_EQ(p->pcore().incarnation_counts().stale_registrations, 1u);
  EXPECT_EQ(p->prefill().refused_registrations(), refused0);  // not a shape refusal
  EXPECT_EQ(p->prefill().peers(), 1u);
  transfer_room(*p, 0x2111, 32, {2, 3}, 1);  // the current incarnation is still served
  EXPECT_EQ(p->prefill().poll(0x2111), KVPoll::Success);
}

TEST(Incarnation, DecodeRefusesStatusesFromAnOlderOrForAnotherIncarnation) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x2121;
  open_room(*p, room, 32, {0, 1}, 1);
  RoomStatus st{room, prefill_rank0(), KVPoll::Failed,
                Failure{ErrorCode::kTransferError, prefill_rank0(), "from the past", monotonic_ns(), realtime_ns()}};
  st.incarnation = p->pcore().incarnation() - 1;  // an older prefill incarnation
  st.peer_incarnation = p->dcore().incarnation();
  p->decode().on_message(Message(st));
  st.incarnation = p->pcore().incarnation();
  st.peer_incarnation = p->dcore().incarnation() - 3;  // meant for an earlier decode incarnation
  p->decode().on_message(Message(st));
  Heartbeat hb{prefill_rank0(), 1, monotonic_ns(), p->pcore().incarnation() - 1};
  p->decode().on_message(Message(hb));
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);
  EXPECT_FALSE(p->dcore().registry().get(room));
  EXPECT_EQ(p->dcore().incarnation_counts().stale_statuses, 2u);
  EXPECT_EQ(p->dcore().incarnation_counts().stale_heartbeats, 1u);
  // The room still completes with the live incarnation.
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 5s));
}

// A decode rank restarted on the same control port: its new registration is a restart (the
// rooms of the old incarnation fail with it as origin, one line above debug), and the new one is
// used at once, before any heartbeat timeout.
TEST(Incarnation, DecodeRestartedOnTheSamePortIsARestart) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x2131;
  open_room(*p, room, 32, {0, 1}, 1);
  const uint16_t port = control_port(p->dcore());
  const uint64_t old_inc = p->dcore().incarnation();
  const uint64_t lines0 = lines_above_debug();
  ASSERT_TRUE(p->start_decode(port).ok());  // kill, then start on the same port
  ASSERT_EQ(control_port(p->dcore()), port);
  ASSERT_GT(p->dcore().incarnation(), old_inc);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 3s));
  auto e = p->pcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(e->origin, decode_rank0());
  EXPECT_NE(e->failure_reason.find("restarted"), std::string::npos) << e->failure_reason;
  EXPECT_EQ(p->pcore().incarnation_counts().peer_restarts, 1u);
  EXPECT_EQ(lines_above_debug() - lines0, 1u);
  ASSERT_TRUE(p->prefill().drained(room));
  p->prefill().release(room);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().peers() == 1; }, 2s));
  transfer_room(*p, 0x2132, 32, {2, 3}, 2);
  EXPECT_EQ(p->prefill().poll(0x2132), KVPoll::Success);
  EXPECT_EQ(p->pcore().incarnation_counts().peer_restarts, 1u);
}

// A prefill rank restarted on the same control port: its bootstrap entry names the same endpoint
// but a new incarnation, which is how the decode rank finds it again. Its room of the old
// incarnation failed with the prefill rank as origin; a new room goes through.
TEST(Incarnation, PrefillRestartedOnTheSamePortIsFoundAgain) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x2141;
  open_room(*p, room, 32, {0, 1}, 1);
  const uint16_t port = control_port(p->pcore());
  const std::string endpoint = p->pcore().control_endpoint();
  p->kill_prefill();
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 3s,
                            [&] { p->pump_decode(); }));
  auto e = p->dcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(e->origin, prefill_rank0());
  p->decode().release(room);
  ASSERT_TRUE(p->start_prefill(port).ok());
  ASSERT_EQ(p->pcore().control_endpoint(), endpoint);  // same address and port
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().peers() == 1; }, 3s))
      << "the decode rank never found the prefill rank restarted on the same endpoint";
  transfer_room(*p, 0x2142, 32, {2, 3}, 2);
  EXPECT_EQ(p->decode().poll(0x2142), KVPoll::Success);
  EXPECT_EQ(p->pcore().incarnation_counts().stale_total(), 0u);
}

// A registration meant for the previous incarnation of the prefill rank is refused; the prefill
// rank answers with a heartbeat of its own incarnation, so the decode rank sees the restart at
// once, fails what it had with the old incarnation and registers with the new one.
TEST(Incarnation, RegistrationForThePreviousPrefillIsAnsweredWithTheNewIncarnation) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  PoolRegistration reg;
  reg.sender = decode_rank0();
  reg.incarnation = p->dcore().incarnation();
  reg.peer_incarnation = p->pcore().incarnation() - 1;  // as if it knew an older prefill
  reg.control_endpoint = p->dcore().control_endpoint();
  p->prefill().on_message(Message(reg));
  EXPECT_EQ(p->pcore().incarnation_counts().stale_registrations, 1u);
  // The decode rank got a heartbeat from the prefill rank's (current) incarnation, which it
  // knows: nothing to do. Its own registration with the right incarnation stands.
  p->pump_for(200ms);
  EXPECT_EQ(p->prefill().peers(), 1u);
  EXPECT_EQ(p->dcore().incarnation_counts().peer_restarts, 0u);
  transfer_room(*p, 0x2151, 32, {0, 1}, 1);
}

// A registration in decode/tp0's name claiming a restart as incarnation `inc` at `endpoint`
// (issue 31: without the secret anyone can send one). It copies the decode rank's pool shape (what
// DecodeEndpoint::send_registration sends), so only its incarnation and endpoint are lies; no
// transport address: it is never used while the claim is held.
PoolRegistration restart_claim(EndpointPair& p, uint64_t inc, const std::string& endpoint) {
  PoolRegistration r = decode_registration(p);
  r.incarnation = inc;
  r.control_endpoint = endpoint;
  r.worker_address.clear();
  return r;
}

// Issue 31, attack 2a: claims stamped now + 59 s (inside the skew bound) with a pool this rank
// cannot use, re-sent every 100 ms. Held, such a claim stood in for the decode rank's real restart
// (always an older incarnation: "a newer claim is held") and was then refused for its shape, so the
// restarted rank was never served. Now a claim is checked like any registration before it is held:
// refused for its shape, nothing held, nothing challenged, and the live peer untouched.
TEST(Incarnation, PrefillNeverHoldsARestartClaimOfAPoolItCannotUse) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  PoolRegistration claim = restart_claim(*p, static_cast<uint64_t>(realtime_ns()) + 59'000'000'000ull,
                                         "tcp://127.0.0.1:9");
  claim.kv_offsets.resize(1);  // the liar's pool: one KV buffer
  const auto bad0 = p->pcore().refusals().count(Refusal::kBadRegistration);
  p->prefill().on_message(Message(claim));
  EXPECT_EQ(p->prefill().pending_restarts(), 0u) << "a claim of a pool this rank cannot use is held";
  EXPECT_EQ(p->pcore().refusals().count(Refusal::kBadRegistration), bad0 + 1);
  // The same claim with the real shape is held (and challenged), as before.
  p->prefill().on_message(Message(restart_claim(*p, claim.incarnation, "tcp://127.0.0.1:9")));
  EXPECT_EQ(p->prefill().pending_restarts(), 1u);
  EXPECT_EQ(p->prefill().connected_peers(), 1u);
}

// Issue 31 (attack F3): a restart claim naming the decode rank's own control endpoint while that
// rank is stopped (SIGSTOP, or starved on a busy host: here its main loop is not run and its
// heartbeat thread sends nothing; its port still accepts, as a stopped process's does). Before:
// the claim was believed once the known incarnation was silent for max(3 heartbeat intervals,
// half the timeout), 400 ms here, and the live rank was cut off for good when it ran again. Now
// only an answer at that endpoint settles it: held however long the silence, and dropped as soon
// as the rank runs again and answers with the known incarnation. Nothing of the peer changed.
TEST(Incarnation, PrefillHoldsASameEndpointClaimWhileTheRankIsStopped) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t inc = p->dcore().incarnation();
  p->pump_for(300ms);  // heartbeats both ways
  ASSERT_NE(p->pcore().monitor().last_heard_ns(decode_rank0()), 0);
  p->dcore().monitor().unwatch(prefill_rank0());  // the stopped rank sends nothing
  p->prefill().on_message(Message(restart_claim(*p, inc + 1'000'000'000, p->dcore().control_endpoint())));
  EXPECT_EQ(p->prefill().pending_restarts(), 1u);
  p->pump_for(1500ms, [&] { p->pump_prefill(); });
  EXPECT_EQ(p->prefill().pending_restarts(), 1u) << "a silence was taken for a restart";
  EXPECT_EQ(p->pcore().incarnation_counts().peer_restarts, 0u);
  p->dcore().monitor().watch(prefill_rank0(), p->pcore().control_endpoint());  // it runs again
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().pending_restarts() == 0; }, 5s));
  EXPECT_EQ(p->pcore().incarnation_counts().peer_restarts, 0u);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().connected_peers() == 1; }, 5s));
  transfer_room(*p, 0x2171, 32, {2, 3}, 2);
  EXPECT_EQ(p->prefill().poll(0x2171), KVPoll::Success);
}

// The same claim while the decode rank runs: its endpoint answers the challenge with the known
// incarnation, so the claim is dropped at once (counted, one warning) and the peer is untouched.
TEST(Incarnation, PrefillDropsARestartClaimTheLiveIncarnationAnswers) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t inc = p->dcore().incarnation();
  const auto refused0 = p->pcore().refusals().count(Refusal::kUnconfirmedRestart);
  p->prefill().on_message(Message(restart_claim(*p, inc + 1'000'000'000, p->dcore().control_endpoint())));
  EXPECT_EQ(p->prefill().pending_restarts(), 1u);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().pending_restarts() == 0; }, 5s));
  EXPECT_EQ(p->pcore().refusals().count(Refusal::kUnconfirmedRestart), refused0 + 2);  // held, then refused
  EXPECT_EQ(p->pcore().incarnation_counts().peer_restarts, 0u);
  EXPECT_EQ(p->prefill().connected_peers(), 1u);
  transfer_room(*p, 0x2181, 32, {2, 3}, 2);
  EXPECT_EQ(p->prefill().poll(0x2181), KVPoll::Success);
}

// Without the secret anyone can send a heartbeat in a prefill rank's name (issue 31, item 4, the
// decode side): a newer incarnation in a frame is a claim the decode rank holds, not a restart.
// While the source is alive its rooms go on and it answers the decode rank's challenge with the
// known incarnation: the claim is dropped. A claim far past this rank's clock is refused outright.
// Once the source is really gone (declared dead, its port refusing) a claim is believed.
TEST(Incarnation, DecodeHoldsARestartClaimUntilTheSourceAnswersOrIsGone) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x2161;
  open_room(*p, room, 32, {0, 1}, 1);
  const uint64_t inc = p->pcore().incarnation();
  p->decode().on_message(Message(Heartbeat{prefill_rank0(), 1, monotonic_ns(), inc + 1}));
  RoomStatus lie{room, prefill_rank0(), KVPoll::Failed,
                 Failure{ErrorCode::kTransferError, prefill_rank0(), "liar", monotonic_ns(), realtime_ns()}};
  lie.incarnation = inc + 2;
  p->decode().on_message(Message(lie));
  const uint64_t far = static_cast<uint64_t>(realtime_ns()) + 3'600'000'000'000ull;  // 1 h ahead
  p->decode().on_message(Message(Heartbeat{prefill_rank0(), 2, monotonic_ns(), far}));
  EXPECT_EQ(p->dcore().refusals().count(Refusal::kFutureIncarnation), 1u);
  p->pump_decode();
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);  // nothing of the live source's room moved
  EXPECT_EQ(p->decode().pending_restarts(), 1u);
  EXPECT_EQ(p->dcore().incarnation_counts().peer_restarts, 0u);
  // The live source answers the challenge: the claim is dropped.
  ASSERT_TRUE(p->pump_until([&] { return p->decode().pending_restarts() == 0; }, 5s));
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 5s));
  EXPECT_EQ(p->dcore().incarnation_counts().peer_restarts, 0u);
  p->decode().release(room);

  p->kill_prefill();  // now the old incarnation is gone: a claim is a restart once that is known
  p->decode().on_message(Message(Heartbeat{prefill_rank0(), 3, monotonic_ns(), inc + 3}));
  ASSERT_TRUE(p->pump_until([&] { return p->dcore().incarnation_counts().peer_restarts == 1; }, 10s,
                            [&] { p->pump_decode(); }));
  EXPECT_EQ(p->decode().pending_restarts(), 0u);
}

// Issue 31 (attack 5c): a RegistrationRefusal in the prefill rank's name, with both ranks' real
// incarnations (in clear on the wire without the secret), sent after the prefill has served rooms
// of this registration. Before: the decode rank took it as the source's, failed every later room
// it feeds, for good. Now a source that reported a room's Success uses our registration: the
// refusal is not its own and is ignored; later rooms succeed.
TEST(Incarnation, DecodeIgnoresARefusalFromASourceThatServesIt) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  transfer_room(*p, 0x2191, 32, {0, 1}, 1);
  ASSERT_EQ(p->decode().poll(0x2191), KVPoll::Success);
  p->decode().release(0x2191);
  RegistrationRefusal forged{prefill_rank0(), Failure{ErrorCode::kProtocolError, prefill_rank0(), "forged",
                                                      monotonic_ns(), realtime_ns()}};
  forged.incarnation = p->pcore().incarnation();
  forged.peer_incarnation = p->dcore().incarnation();
  p->decode().on_message(Message(forged));
  transfer_room(*p, 0x2192, 32, {2, 3}, 2);
  EXPECT_EQ(p->decode().poll(0x2192), KVPoll::Success);
}

// Issue 31 (found reviewing the challenge work): a heartbeat in a dead peer's name with its known
// incarnation counted as hearing from it, so the peer was taken for back (its registration used
// again) and declared dead again a timeout later; a liar kept a dead peer flapping. Now a dead
// peer is taken for back only when its known endpoint answers a challenge with its incarnation.
TEST(Incarnation, AForgedHeartbeatDoesNotReviveADeadPeerItsAnswerDoes) {
  PairConfig cfg;
  cfg.prefill_deadlines.heartbeat_timeout_ms = 300;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  p->dcore().monitor().unwatch(prefill_rank0());  // the decode rank stops: no heartbeat, no main loop
  ASSERT_TRUE(p->pump_until([&] { return p->pcore().monitor().stats().reported == 1; }, 10s,
                            [&] { p->pump_prefill(); }))
      << "the stopped decode rank was never declared dead";
  const Heartbeat forged{decode_rank0(), 0, monotonic_ns(), p->dcore().incarnation()};
  for (int i = 0; i < 5; ++i) {
    p->prefill().on_message(Message(forged));
    p->pump_for(50ms, [&] { p->pump_prefill(); });
  }
  EXPECT_EQ(p->pcore().monitor().stats().revived, 0u) << "a forged heartbeat revived a dead peer";
  EXPECT_EQ(p->prefill().connected_peers(), 0u);
  // It runs again: its heartbeats are challenged, it answers, it is taken for back.
  p->dcore().monitor().watch(prefill_rank0(), p->pcore().control_endpoint());
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().connected_peers() == 1; }, 10s));
  EXPECT_EQ(p->pcore().monitor().stats().revived, 1u);
  transfer_room(*p, 0x21a1, 32, {2, 3}, 2);
  EXPECT_EQ(p->prefill().poll(0x21a1), KVPoll::Success);
}

// Issue 31, attack 2d: without the secret anyone can PUT a prefill rank's bootstrap entry again
// with its real endpoint and an incarnation stamped ahead (now + 59 s). A decode rank that looked
// the rank up took that incarnation for the rank's own and addressed everything to it, so the real
// rank refused every frame as meant for another incarnation, and the decode rank refused the real
// rank's frames as older: never served again. Now a frame from an older incarnation than the known
// one makes the decode rank challenge the known endpoint; its owner's answer is adopted.
TEST(Incarnation, DecodeGivenAForgedIncarnationByTheBootstrapAdoptsTheOneAtTheEndpoint) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  BootstrapClient liar(p->bootstrap_address(), 2000);
  auto entry = liar.lookup(0, 0, 0);
  ASSERT_TRUE(entry.ok()) << entry.status().str();
  entry->incarnation = static_cast<uint64_t>(realtime_ns()) + 59'000'000'000ull;
  ASSERT_TRUE(liar.register_rank(*entry).ok());
  ASSERT_TRUE(p->start_decode().ok());  // a restarted decode rank looks the prefill rank up
  ASSERT_TRUE(p->pump_until(
      [&] { return p->pcore().incarnation_counts().peer_restarts == 1 && p->prefill().connected_peers() == 1; }, 10s))
      << "the decode rank never registered with the incarnation at the prefill's endpoint";
  transfer_room(*p, 0x21b1, 32, {2, 3}, 2);
  EXPECT_EQ(p->prefill().poll(0x21b1), KVPoll::Success);
  EXPECT_EQ(p->decode().poll(0x21b1), KVPoll::Success);
}

}  // namespace
}  // namespace kvferry

namespace kvferry {
namespace {

// Issue 34 item 4 (attack on the compatibility handshake): a prefill rank that died and came back
// on the same endpoint with a fingerprint this decode rank cannot serve (here: another page size)
// is checked when the decode rank finds it again, before its registration is answered or any of
// its fields is used (DecodeEndpoint::admit_rediscovered). The room that waited for it fails here
// with incompatible_peer, origin this decode rank, naming the field and both values; without the
// check the decode rank registered with it as with a compatible peer and only the prefill rank's
// refusal (origin prefill) ended the room.
TEST(Incarnation, APrefillRankRestartedIncompatibleIsRefusedWhenFoundAgain) {
  auto p = testing::make_pair();
  ASSERT_TRUE(p);
  const uint64_t lost = 0x3141;
  testing::open_room(*p, lost, 32, {0, 1}, 1);
  const uint16_t port = control_port(p->pcore());
  p->kill_prefill();
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(lost) == KVPoll::Failed; }, 3s,
                            [&] { p->pump_decode(); }));
  p->decode().release(lost);
  // A room opened while its source is dead waits for it (its metadata goes when it is back).
  const uint64_t waiting = 0x3142;
  p->decode().add_room(waiting, 32);
  ASSERT_TRUE(p->decode().init(waiting, {2, 3}, 2).ok());
  ASSERT_NE(p->decode().poll(waiting), KVPoll::Failed);
  testing::TestLayoutSpec other;
  other.page_size = 32;
  ASSERT_TRUE(p->start_prefill(port, &other).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(waiting) == KVPoll::Failed; }, 10s))
      << "the room waiting for the restarted source never failed";
  auto e = p->dcore().registry().get(waiting);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kIncompatiblePeer) << e->str();
  EXPECT_EQ(e->origin, testing::decode_rank0()) << e->str();
  EXPECT_NE(e->failure_reason.find("page_size"), std::string::npos) << e->failure_reason;
  EXPECT_NE(e->failure_reason.find("16"), std::string::npos) << e->failure_reason;
  EXPECT_NE(e->failure_reason.find("32"), std::string::npos) << e->failure_reason;
  EXPECT_EQ(p->prefill().peers(), 0u) << "the incompatible prefill rank took the decode rank as its peer";
}

}  // namespace
}  // namespace kvferry
