// The decode side of an endpoint pair (endpoint_pair_test_util.h): peers that die, restart, stay
// down or are only busy, and what happens to the rooms they feed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "endpoint/endpoint_pair_steps.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::decode_rank0;
using testing::EndpointPair;
using testing::iota_pages;
using testing::make_pair;
using testing::ms_since;
using testing::open_room;
using testing::PairConfig;
using testing::prefill_rank0;
using testing::transfer_room;

// Naive design: peer death is noticed only by HTTP health probes of the other process (SGLang:
// ~10-16 s), and the dead peer is kept (or blacklisted forever): a restarted rank is never used.
TEST(EndpointPair, Defect8_PeerDeathDetectedFast_Defect7_RestartedPeerIsUsedAgain) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1801, other = 0x1802;
  open_room(*p, room, 64, {0, 1, 2, 3}, 1);
  open_room(*p, other, 32, {4, 5}, 2);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());  // mid-transfer
  ASSERT_TRUE(p->pump_until([&] { return p->chunks_done.size() == 1; }, 2s));
  ASSERT_EQ(p->prefill().poll(room), KVPoll::Transferring);

  const uint64_t lines0 = lines_above_debug();
  p->kill_decode();
  const int64_t t0 = monotonic_ns();
  ASSERT_TRUE(p->pump_until(
      [&] { return p->prefill().poll(room) == KVPoll::Failed && p->prefill().poll(other) == KVPoll::Failed; }, 3s));
  const int64_t detect_ms = ms_since(t0);
  RecordProperty("detect_ms", static_cast<int>(detect_ms));
  EXPECT_LT(detect_ms, 1500) << "peer death took " << detect_ms << " ms";
  for (uint64_t r : {room, other}) {
    auto e = p->pcore().registry().get(r);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
    EXPECT_EQ(e->origin, decode_rank0());
    EXPECT_TRUE(e->is_from_another_rank);
    EXPECT_TRUE(p->prefill().drained(r));
  }
  EXPECT_EQ(lines_above_debug() - lines0, 1u);  // one line per dead peer, not one per room
  EXPECT_EQ(p->prefill().peers(), 0u);          // the dead peer is forgotten
  // Still listened to (a peer that answers again is reconnected), but not reported dead twice.
  EXPECT_EQ(p->pcore().monitor().watched(), 1u);
  EXPECT_TRUE(p->pcore().monitor().take_dead(monotonic_ns() + 10'000'000'000).empty());
  p->prefill().release(room);
  p->prefill().release(other);

  // A new decode process registers again and is used for a new room.
  ASSERT_TRUE(p->start_decode().ok());
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().peers() == 1; }, 2s));
  transfer_room(*p, 0x1803, 64, {7, 8, 9, 10}, 3);
  EXPECT_EQ(p->prefill().poll(0x1803), KVPoll::Success);
  EXPECT_EQ(lines_above_debug() - lines0, 1u);
}

// The decode side's view: its prefill peer dies, the rooms it feeds fail at once with the peer
// as origin, and a restarted prefill rank found again at the bootstrap service is used again.
TEST(EndpointPair, Defect8_PrefillDeathDetectedFast_Defect7_RestartedPrefillIsFoundAgain) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1811;
  open_room(*p, room, 32, {0, 1}, 1);
  p->kill_prefill();
  const int64_t t0 = monotonic_ns();
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 3s));
  const int64_t detect_ms = ms_since(t0);
  RecordProperty("detect_ms", static_cast<int>(detect_ms));
  EXPECT_LT(detect_ms, 1500) << "peer death took " << detect_ms << " ms";
  auto e = p->dcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(e->origin, prefill_rank0());
  EXPECT_TRUE(e->is_from_another_rank);
  // A silence is only a presumed death (the process may still be writing): not drained, so a
  // room released now is quarantined, its pages leaked until the source is known to be gone.
  EXPECT_FALSE(p->decode().drained(room, monotonic_ns()));
  p->decode().release(room);
  EXPECT_EQ(p->decode().quarantined_rooms(), 1u);
  EXPECT_EQ(p->decode().quarantined_pages(), 3u);  // 2 pages and the aux row

  ASSERT_TRUE(p->start_prefill().ok());  // re-registers at the bootstrap service, new endpoint
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().peers() == 1; }, 3s))
      << "the decode rank never registered its pool with the restarted prefill rank";
  // A newer incarnation registered: the old process is gone, the quarantined room is reclaimed.
  EXPECT_EQ(p->decode().take_reclaimed(), std::vector<uint64_t>{room});
  EXPECT_EQ(p->decode().quarantined_pages(), 0u);
  transfer_room(*p, 0x1812, 32, {2, 3}, 2);
  EXPECT_EQ(p->decode().poll(0x1812), KVPoll::Success);
}

// A false death (a live prefill's heartbeats were not heard, e.g. on a saturated host) must not
// let the decode rank reuse pages the prefill is still writing: the room fails at once, but its
// pages are freed only once the prefill, heard again, confirms that none of its writes can land.
// Naive design: a peer reported dead "writes nothing more", its rooms' pages go back to the pool,
// and its late writes corrupt the next room that gets them.
TEST(EndpointPair, FalseDeathKeepsPagesUntilTheLivePrefillConfirmsTheDrain) {
  PairConfig cfg;
  cfg.decode_deadlines.drain_timeout_ms = 600000;  // a drain only by confirmation, never by deadline
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x1841;
  open_room(*p, room, 32, {0, 1}, 1);
  // Its writes are in flight (held) when the decode rank takes it for dead.
  p->pcore().faults()->hold_room(room);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  const uint64_t failed0 = p->pcore().transport().stats().failed_batches;
  p->dcore().monitor().mark_dead(prefill_rank0());  // as if its heartbeats had stopped
  p->decode().on_peer_dead(prefill_rank0(), "test: heartbeats not heard");
  ASSERT_EQ(p->decode().poll(room), KVPoll::Failed);
  EXPECT_FALSE(p->decode().drained(room, monotonic_ns()));
  p->decode().release(room);
  ASSERT_EQ(p->decode().quarantined_rooms(), 1u);

  // The prefill never noticed: it hears the decode's failure once the decode hears it again and
  // registers anew, the same pool: the connection is kept, so the writes in flight on it complete
  // (replacing it would fail them here while they may still land there).
  // Failed there by the failures the decode rank sent after its registration (one socket, in
  // order): the registration was handled; any connect it started has ended before the release.
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 20s));
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().connecting_peers() == 0; }, 20s));
  p->pcore().faults()->release_held(room);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().reclaimed_total() == 1; }, 20s))
      << "the quarantined room was never reclaimed";
  EXPECT_EQ(p->pcore().transport().stats().failed_batches, failed0) << "the live connection was replaced";
  EXPECT_EQ(p->decode().take_reclaimed(), std::vector<uint64_t>{room});
  EXPECT_EQ(p->decode().quarantined_pages(), 0u);
  EXPECT_TRUE(p->prefill().poll(room) == KVPoll::Failed || p->prefill().poll(room) == KVPoll::Success);

  // The peer is used again: a new room on the same pages succeeds and holds its own bytes.
  transfer_room(*p, 0x1842, 32, {0, 1}, 2);
  EXPECT_EQ(p->decode().poll(0x1842), KVPoll::Success);
  EXPECT_EQ(p->verify_decode(0x1842, {0, 1}), 0u);
}

// A room its source never had (its engine failed the room while that rank was out of it, so the
// room was never added there) fails here: the source answers that it never wrote and never will,
// so the room is drained by that answer, not quarantined at the drain deadline. Seen before: 32
// rooms of a 2+2 replay quarantined for good after a prefill follower was stopped for 6 s, and the
// decode pool ran dry behind them.
TEST(EndpointPair, RoomNeverAddedAtTheSourceIsDrainedByItsAnswer) {
  PairConfig cfg;
  cfg.decode_deadlines.drain_timeout_ms = 600000;  // a drain only by the answer, never by deadline
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  const uint64_t room = 0x1851;
  p->decode().add_room(room, 32);  // never added at the prefill rank
  ASSERT_TRUE(p->decode().init(room, {0, 1}, 1).ok());
  p->pump_for(200ms);  // the metadata waits there, kept for a room not added yet
  p->decode().fail(room, ErrorCode::kAborted, "aborted by the router", decode_rank0(), monotonic_ns(), true);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 20s))
      << "the source never confirmed it had nothing to drain";
  p->decode().release(room);
  EXPECT_EQ(p->decode().quarantined_rooms(), 0u);
  // Added there only now: it fails at once with the decode's cause and writes nothing.
  p->prefill().add_room(room, 32);
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Failed);
  auto e = p->pcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kAborted);
  EXPECT_EQ(e->origin, decode_rank0());
}

// Issue 3 ("No rank waits forever"): a killed prefill rank restarts and its engine takes rooms
// again before this decode rank has found it at the bootstrap service (a lookup every 100 ms).
// Before the fix such a room failed here at once ("prefill/tp0 is down", a wrong attribution)
// and the restarted prefill rank was never told: it waited for metadata until its 300 s
// bootstrap timeout, and the router for its request timeout. Now the room waits for the source
// to register again and then goes through.
void kill_prefill_until_detected(EndpointPair& p) {
  const uint64_t seen = 0x1830;  // a room in flight, so the death is observed through it
  open_room(p, seen, 32, {0, 1}, 1);
  p.kill_prefill();
  ASSERT_TRUE(p.pump_until([&] { return p.decode().poll(seen) == KVPoll::Failed; }, 3s));
  // Silent, so only presumed dead: released unconfirmed, the room is quarantined.
  ASSERT_FALSE(p.decode().drained(seen, monotonic_ns()));
  p.decode().release(seen);
  ASSERT_EQ(p.decode().quarantined_rooms(), 1u);
}

TEST(EndpointPair, Issue3_RoomForRestartedPrefillNotYetFoundAgainSucceeds) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  kill_prefill_until_detected(*p);
  ASSERT_TRUE(p->start_prefill().ok());  // back at the bootstrap service, not yet found again
  const uint64_t room = 0x1831;
  p->prefill().add_room(room, 32);
  p->decode().add_room(room, 32);  // no pump in between: decode still has the peer down
  ASSERT_TRUE(p->decode().init(room, {2, 3}, 2).ok());
  EXPECT_EQ(p->decode().poll(room), KVPoll::Bootstrapping) << "failed at once: "
      << (p->dcore().registry().get(room) ? p->dcore().registry().get(room)->str() : "");
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) != KVPoll::Bootstrapping; }, 3s))
      << "the restarted prefill rank never got the room's metadata";
  ASSERT_EQ(p->prefill().poll(room), KVPoll::WaitingForInput);
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 3s));
  EXPECT_EQ(p->verify_decode(room, {2, 3}), 0u);
  EXPECT_FALSE(p->dcore().registry().get(room));
}

// The same window, but the room fails here (an abort, a local fault) before the source is found
// again: the restarted prefill rank is told when it is found, so it does not wait for metadata.
TEST(EndpointPair, Issue3_FailureWhileSourceDownIsToldWhenItIsBack) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  kill_prefill_until_detected(*p);
  ASSERT_TRUE(p->start_prefill().ok());
  const uint64_t room = 0x1832;
  p->prefill().add_room(room, 32);
  p->decode().add_room(room, 32);
  p->decode().fail(room, ErrorCode::kAborted, "aborted by the router", decode_rank0(), monotonic_ns(), true);
  ASSERT_TRUE(p->decode().drained(room, monotonic_ns()));  // no metadata went out
  p->decode().release(room);
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 3s))
      << "the restarted prefill rank still waits for metadata";
  auto e = p->pcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kAborted);
  EXPECT_EQ(e->origin, decode_rank0());
  EXPECT_TRUE(e->is_from_another_rank);
}

// A source that stays down: a room waiting for it fails within the lookup timeout after the death,
// with the source as origin; once that passed, a new room for it fails at once.
TEST(EndpointPair, Issue3_RoomWaitingForDeadSourceFailsAtLookupTimeout) {
  PairConfig cfg;
  cfg.decode_deadlines.lookup_timeout_ms = 1500;
  auto p = make_pair(cfg);
  ASSERT_TRUE(p);
  kill_prefill_until_detected(*p);
  const int64_t t_detected = monotonic_ns();
  const uint64_t room = 0x1833;
  p->decode().add_room(room, 32);
  ASSERT_TRUE(p->decode().init(room, {2, 3}, 2).ok());
  EXPECT_EQ(p->decode().poll(room), KVPoll::Bootstrapping);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Failed; }, 4s));
  const int64_t failed_after_ms = ms_since(t_detected);
  EXPECT_GE(failed_after_ms, 1400);  // not before the deadline: the source could have come back
  EXPECT_LT(failed_after_ms, 2500);
  auto e = p->dcore().registry().get(room);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kPeerUnreachable);
  EXPECT_EQ(e->origin, prefill_rank0());
  EXPECT_NE(e->failure_reason.find("did not register again within 1500 ms"), std::string::npos) << e->failure_reason;
  EXPECT_TRUE(p->decode().drained(room, monotonic_ns()));
  p->decode().release(room);

  const uint64_t late = 0x1834;
  p->decode().add_room(late, 32);
  EXPECT_EQ(p->decode().poll(late), KVPoll::Failed);
  EXPECT_TRUE(p->decode().drained(late, monotonic_ns()));
}

// Naive design: a single transport error marks the peer dead until it re-registers, but a live
// peer never re-registers, so every later room bound for it fails (Mooncake's blacklist) or waits
// for its timeout.
TEST(EndpointPair, Defect7_TransientErrorDoesNotBlacklistPeer) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1701;
  open_room(*p, room, 32, {0, 1}, 1);
  p->pcore().faults()->fail_next_writes(1, ErrorCode::kPeerUnreachable);
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until(
      [&] { return p->prefill().poll(room) == KVPoll::Failed && p->decode().poll(room) == KVPoll::Failed; }, 2s));
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 2s));
  p->prefill().release(room);
  p->decode().release(room);

  p->pump_for(300ms);  // the decode rank is alive: heartbeats keep arriving
  const uint64_t next = 0x1702;
  p->prefill().add_room(next, 32);
  p->decode().add_room(next, 32);
  ASSERT_TRUE(p->decode().init(next, {2, 3}, 2).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(next) != KVPoll::Bootstrapping; }, 2s));
  ASSERT_EQ(p->prefill().poll(next), KVPoll::WaitingForInput)
      << "live decode peer blacklisted: " << p->pcore().registry().get(next)->str();
  ASSERT_TRUE(p->send_chunk(next, 0, {0, 1}, 2).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(next) == KVPoll::Success; }, 3s));
}

// Naive design: liveness is judged by the main loop's own traffic or by probes answered by the
// main loop, so a peer busy for longer than the timeout (a long forward pass) is declared dead.
TEST(EndpointPair, Defect8_BusyPeerNotDeclaredDead) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1821;
  open_room(*p, room, 32, {0, 1}, 1);
  const uint64_t lines0 = lines_above_debug();

  p->pump_for(2s, [&] { p->pump_prefill(); });  // decode busy for 2 s (> 3x the timeout)
  EXPECT_EQ(p->prefill().poll(room), KVPoll::WaitingForInput);
  EXPECT_EQ(p->prefill().peers(), 1u);
  p->pump_decode();
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);
  EXPECT_FALSE(p->dcore().registry().get(room));

  p->pump_for(2s, [&] { p->pump_decode(); });  // and now prefill busy for 2 s
  p->pump_prefill();
  EXPECT_EQ(p->prefill().poll(room), KVPoll::WaitingForInput);
  EXPECT_EQ(p->decode().poll(room), KVPoll::WaitingForInput);
  EXPECT_EQ(p->prefill().peers(), 1u);
  EXPECT_EQ(p->decode().peers(), 1u);

  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 3s));
  EXPECT_EQ(p->verify_decode(room, {0, 1}), 0u);
  EXPECT_EQ(lines_above_debug(), lines0);
}

}  // namespace
}  // namespace kvferry

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::make_pair;

// A decode request aborted while it waits for memory (its room open, no metadata sent) tells its
// source; when the control socket refuses that status (its queue to the source is full: a burst
// of thousands of rooms failing at once), nothing else would ever tell it, since no metadata
// went out to ask again: the status is held and sent again from tick(), and the source fails the
// room with decode's cause instead of waiting for its bootstrap deadline (decode_reask.cc).
TEST(EndpointPair, AFailureStatusTheControlSocketRefusedIsSentAgain) {
  auto p = make_pair();
  ASSERT_TRUE(p);
  const uint64_t room = 0x1B01;
  p->prefill().add_room(room, 64);
  p->decode().add_room(room, 0, -1);
  bool full = true;
  int refused = 0;
  p->dcore().set_send_refusal([&](const std::string&, const Message& m) {
    const bool refuse = full && std::holds_alternative<RoomStatus>(m);
    refused += refuse;
    return refuse;
  });
  p->decode().fail(room, ErrorCode::kAborted, "aborted while waiting for memory", p->dcore().self(), monotonic_ns(),
                   true);
  p->pump_for(50ms);
  EXPECT_GT(refused, 0);
  EXPECT_EQ(p->prefill().poll(room), KVPoll::Bootstrapping) << "the queue is full: nothing reached the source";
  full = false;  // the queue drained
  ASSERT_TRUE(p->pump_until([&] { return p->prefill().poll(room) == KVPoll::Failed; }, 5s))
      << "the refused status was never sent again";
  auto f = p->pcore().registry().get(room);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->code, ErrorCode::kAborted);
  EXPECT_EQ(f->origin, p->dcore().self());
  EXPECT_EQ(f->failure_reason, "aborted while waiting for memory");
  p->dcore().set_send_refusal({});
}

}  // namespace
}  // namespace kvferry
