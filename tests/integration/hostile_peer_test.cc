// Issue 13, item 5: a hostile peer (docs/security.md, "Tests"). Real ranks (a prefill and a decode,
// tcp transport, engine buffers between canary bytes; hostile_peer_harness.h) are attacked by a
// liar with sockets of its own that speaks kvferry's wire formats and lies. After every case:
// the attacked ranks still complete an honest room byte-exact, a room that was live during the
// attack (the bystander) completes too (no honest room failed), every canary byte is unchanged,
// and the refusal shows in the ranks' counters or log lines. Every case runs without and with the
// cluster secret (KVFERRY_SECRET_FILE, mode 600): with it the liar, which lacks it, is refused
// before anything is parsed (CURVE/ZAP: no frame of it reaches a rank; HTTP: 401).
#include <future>
#include <random>

#include "hostile_peer_fixture.h"

namespace kvferry_itest {
namespace {

// The liar's region is real, its registration claims four times as much (a consistent shape in a
// span that is not there). The prefill rank accepts the claim (it cannot see the peer's memory)
// and connects; its writes to pages past the real region are refused by the receiver's own span
// check, so only the liar's room fails, with protocol_error.
TEST_P(HostilePeer, RegistrationRegionLargerThanReal) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(20);
  ASSERT_TRUE(liar().make_region(registration_bytes(liar_registration(*c_.honest_registration, liar(), kPages))).ok());
  PoolRegistration lie = liar_registration(*c_.honest_registration, liar(), 4 * kPages);
  ASSERT_GT(registration_bytes(lie), liar().region.bytes);
  liar_register(lie);
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return c_.pe().connected_peers() == 2; })) << c_.pe().last_refusal();
    auto tx = liar_room(21, {kPages + 1, 2 * kPages, 4 * kPages - 1});  // beyond the real region
    ASSERT_TRUE(c_.pump_until([&] { return tx->poll() != KVPoll::Bootstrapping; }));
    ASSERT_EQ(tx->poll(), KVPoll::WaitingForInput);
    ASSERT_TRUE(tx->send(std::vector<uint64_t>{0, 1, 2}, {}, true).ok());
    ASSERT_TRUE(c_.pump_until([&] { return tx->poll() == KVPoll::Failed; })) << to_string(tx->poll());
    EXPECT_EQ(tx->failure()->failure().code, ErrorCode::kProtocolError) << tx->failure()->failure().describe();
  }
  expect_unharmed(bystander);
}

// A span smaller than the buffers the registration places in it: refused before use (counted,
// logged, told to the liar), and the liar's room fails with the refusal's record.
TEST_P(HostilePeer, RegistrationRegionSmallerThanReal) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(22);
  PoolRegistration lie = liar_registration(*c_.honest_registration, liar(), kPages);
  lie.spans[0].bytes = registration_bytes(lie) / 2;
  liar_register(lie);
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return liar().received_count<RegistrationRefusal>() == 1; }));
    EXPECT_EQ(c_.pe().refused_registrations(), 1u);
    EXPECT_EQ(logs_.count("rejected pool registration from decode"), 1u);
    auto tx = liar_room(23, {0, 1, 2});
    ASSERT_TRUE(c_.pump_until([&] { return tx->poll() == KVPoll::Failed; })) << to_string(tx->poll());
    EXPECT_EQ(tx->failure()->failure().code, ErrorCode::kProtocolError);
    EXPECT_NE(tx->failure()->failure().reason.find("refused"), std::string::npos) << tx->failure()->failure().reason;
  }
  expect_unharmed(bystander);
}

// Heads outside the model, and heads that do not hold what the transfer plan sends that rank
// (page_bytes consistent with the claimed heads): both refused by check_registration.
TEST_P(HostilePeer, RegistrationWrongHeadRange) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(24);
  PoolRegistration outside = liar_registration(*c_.honest_registration, liar(), kPages);
  outside.first_head = 4;  // the model has 4 KV heads
  liar_register(outside);
  PoolRegistration narrow = outside;
  narrow.first_head = 2;
  narrow.heads_per_rank = 2;
  narrow.page_bytes = kPageBytes / 2;
  narrow = liar_registration(narrow, liar(), kPages);  // offsets for the narrower pages
  liar_register(narrow);
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return c_.pe().refused_registrations() == 2; }));
    EXPECT_EQ(logs_.count("outside the model's 4 KV heads"), 1u) << logs_.matching("rejected pool registration");
    EXPECT_EQ(logs_.count("the transfer plan sends it"), 1u) << logs_.matching("rejected pool registration");
    EXPECT_EQ(c_.pe().connected_peers(), 1u);
  }
  expect_unharmed(bystander);
}

// A worker address and remote keys of garbage in an otherwise consistent registration: refused,
// or the connect fails (the liar is then down: its room fails at once); nothing else is touched.
TEST_P(HostilePeer, GarbageWorkerAddressAndRkey) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(26);
  PoolRegistration lie = liar_registration(*c_.honest_registration, liar(), kPages);
  std::mt19937 rng(13);
  lie.worker_address.resize(600);
  for (char& ch : lie.worker_address) ch = static_cast<char>(rng());
  lie.spans[0].packed_rkey.assign(300, '\0');
  for (char& ch : lie.spans[0].packed_rkey) ch = static_cast<char>(rng());
  liar_register(lie);
  if (!secret()) {
    const std::string failed_connect = "cannot connect to decode peer " + liar().self.str();
    ASSERT_TRUE(c_.pump_until([&] { return c_.pe().refused_registrations() == 1 || logs_.count(failed_connect) == 1; }))
        << "neither refused nor failed";
    auto tx = liar_room(27, {0, 1, 2});
    ASSERT_TRUE(c_.pump_until([&] { return tx->poll() == KVPoll::Failed; })) << to_string(tx->poll());
    EXPECT_EQ(c_.pe().connected_peers(), 1u);
  }
  expect_unharmed(bystander);
}

// The liar, registered and with a room being written, registers a different pool (a new region
// and worker) while its writes are in flight and an honest room is live; and registers in the
// honest decode rank's name with an older incarnation. The first fails nothing but the liar's
// room (if anything); the second is refused as stale.
TEST_P(HostilePeer, ReRegistrationRacingLiveRooms) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(28);
  ASSERT_TRUE(liar().make_region(registration_bytes(liar_registration(*c_.honest_registration, liar(), kPages))).ok());
  liar_register(liar_registration(*c_.honest_registration, liar(), kPages));
  PoolRegistration as_decode = *c_.honest_registration;
  as_decode.incarnation = 3;  // older than the real decode rank's
  as_decode.control_endpoint = liar().control->endpoint();
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return c_.pe().connected_peers() == 2; })) << c_.pe().last_refusal();
    auto tx = liar_room(29, {0, 1, 2});
    ASSERT_TRUE(c_.pump_until([&] { return tx->poll() == KVPoll::WaitingForInput; })) << to_string(tx->poll());
    ASSERT_TRUE(tx->send(std::vector<uint64_t>{3, 4, 5}, {}, true).ok());
    std::unique_ptr<Transport> old = std::move(liar().transport);  // its writes may be in flight
    ASSERT_TRUE(liar().make_region(registration_bytes(liar_registration(*c_.honest_registration, liar(), kPages))).ok());
    liar().incarnation = 8;
    liar_register(liar_registration(*c_.honest_registration, liar(), kPages));
    liar_send(pctl(), Message{as_decode});
    ASSERT_TRUE(c_.pump_until([&] { return c_.pcore().incarnation_counts().stale_registrations == 1; }));
    ASSERT_TRUE(c_.pump_until([&] { return tx->poll() == KVPoll::Success || tx->poll() == KVPoll::Failed; }));
    ASSERT_TRUE(c_.pump_until([&] { return c_.pe().connected_peers() == 2 && c_.pe().connecting_peers() == 0; }));
    EXPECT_EQ(c_.pe().transport_peer({Role::kDecode, 0, 0, 0}).has_value(), true);
    c_.pump_until([&] { return tx->release_safe(); }, 20s);
    tx.reset();
    old.reset();
  } else {
    liar_send(pctl(), Message{as_decode});
  }
  expect_unharmed(bystander);
}

// Failed statuses for the live honest room, forged four ways: to the decode rank from a prefill
// rank that is not one of the room's sources, and in the real source's name from an older
// incarnation; to the prefill rank in the decode rank's name from an older incarnation, and with
// its real incarnation but meant for another incarnation of the prefill rank. Every one refused
// (logged, counted as stale). (A status from a decode rank that is not a destination of the room
// is refused by PrefillEndpoint::from_destination, a change landing separately; one from a member
// that is a destination is the trust limit of docs/security.md.)
TEST_P(HostilePeer, ForgedStatusForAnotherPeersRoom) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(30);
  const RankId other_prefill{Role::kPrefill, 0, 1, 0}, real_prefill{Role::kPrefill, 0, 0, 0};
  const RankId real_decode{Role::kDecode, 0, 0, 0};
  auto forged = [&](const RankId& as, uint64_t inc, uint64_t peer_inc) {
    RoomStatus st{bystander.id, as, KVPoll::Failed, Failure{ErrorCode::kTransferError, as, "forged", monotonic_ns(), 0}};
    st.incarnation = inc;
    st.peer_incarnation = peer_inc;
    return Message{st};
  };
  liar_send(dctl(), forged(other_prefill, 9, c_.dcore().incarnation()));
  liar_send(dctl(), forged(real_prefill, 9, c_.dcore().incarnation()));
  liar_send(pctl(), forged(real_decode, 9, c_.pcore().incarnation()));
  liar_send(pctl(), forged(real_decode, c_.honest_registration->incarnation, c_.pcore().incarnation() + 1));
  if (!secret()) {
    // The prefill rank of TP rank 1 is no source of the decode rank in the plan (prefill TP 1):
    // refused before its frame is decoded (issue 31), so only the second reaches the hook.
    ASSERT_TRUE(c_.pump_until([&] {
      return c_.liar_frames_at_decode == 1 && c_.pcore().incarnation_counts().stale_statuses == 2 &&
             c_.dcore().refusals().count(Refusal::kOutsidePlan) == 1;
    }));
    EXPECT_TRUE(c_.pump_until([&] { return c_.dcore().incarnation_counts().stale_statuses == 1; }));
    EXPECT_EQ(logs_.count("frame from " + other_prefill.str() + " refused: not a source"), 1u);
  }
  EXPECT_EQ(bystander.tx->poll(), KVPoll::WaitingForInput);
  EXPECT_EQ(bystander.rx->poll(), KVPoll::WaitingForInput);
  expect_unharmed(bystander);
}

// Frames too large for the control socket (ZeroMQ drops the connection before any of it is
// kept), a header claiming a 4 GiB body, and a metadata claiming more page indices than the
// codec allows: none is parsed into a message; the liar's next frame still gets through.
TEST_P(HostilePeer, OversizedFrame) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(32);
  std::string meta = encode(Message{RoomMetadata{33, liar().self, {1, 2}, 0, {}, 1, 7, 0}});
  std::string huge_body = meta;
  huge_body[8] = huge_body[9] = huge_body[10] = huge_body[11] = '\xff';  // body_length u32
  std::string many = meta;
  // The kv_indices count follows the sender: find the u32 2 that precedes the two indices.
  const size_t idx = many.find(std::string("\x02\x00\x00\x00", 4) + std::string("\x01\x00\x00\x00\x00\x00\x00\x00", 8));
  ASSERT_NE(idx, std::string::npos);
  const uint32_t too_many = kMaxKvIndices + 1;
  std::memcpy(many.data() + idx, &too_many, 4);
  liar_send(pctl(), huge_body);
  liar_send(pctl(), many);
  Message hb{Heartbeat{liar().self, 1, monotonic_ns(), 0}};
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return logs_.count("rejected control frame") == 2; }))
        << logs_.matching("rejected control frame");
  }
  std::string oversized(kFrameCap + 1, '\0');
  std::memcpy(oversized.data(), meta.data(), 12);
  liar_send(pctl(), oversized);
  oversized.clear();
  oversized.shrink_to_fit();
  if (!secret()) {
    // The connection the oversized frame was on is dropped; a later frame comes on a new one.
    const uint64_t before = c_.liar_frames_at_prefill;
    ASSERT_TRUE(c_.pump_until([&] {
      liar_send(pctl(), hb);
      c_.pump_for(50ms);
      return c_.liar_frames_at_prefill > before;
    }));
    EXPECT_EQ(logs_.count("rejected control frame"), 2u) << "the oversized frame was parsed";
  }
  expect_unharmed(bystander);
}

// Every prefix of a valid registration, metadata, status and heartbeat, and a valid frame with a
// byte appended: each refused by the codec (one log line each), nothing applied.
TEST_P(HostilePeer, TruncatedFrame) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(34);
  std::vector<std::string> frames;
  frames.push_back(encode(Message{liar_registration(*c_.honest_registration, liar(), kPages)}));
  frames.push_back(encode(Message{RoomMetadata{bystander.id, liar().self, {1, 2, 3}, 0, {}, 1, 7, 0}}));
  frames.push_back(encode(Message{RoomStatus{bystander.id, liar().self, KVPoll::Failed,
                                             Failure{ErrorCode::kAborted, liar().self, "lie", 1, 1}, true, 7, 0}}));
  frames.push_back(encode(Message{Heartbeat{liar().self, 1, 1, 7}}));
  const uint64_t malformed0 = c_.pcore().refusals().count(Refusal::kMalformed);
  size_t sent = 0;
  for (const std::string& f : frames) {
    for (size_t n = 1; n < f.size(); ++n, ++sent) liar_send(pctl(), f.substr(0, n));
    liar_send(pctl(), f + '\0');
    ++sent;
  }
  if (!secret()) {
    // Every one refused and counted; at most RefusalLog::kDebugLinesPerInterval + 1 lines.
    ASSERT_TRUE(c_.pump_until([&] { return c_.pcore().refusals().count(Refusal::kMalformed) == malformed0 + sent; }))
        << c_.pcore().refusals().count(Refusal::kMalformed) - malformed0 << " of " << sent;
    EXPECT_LE(logs_.count("rejected control frame"), 1 + RefusalLog::kDebugLinesPerInterval);
    EXPECT_EQ(c_.liar_frames_at_prefill, 0u);
    EXPECT_EQ(c_.pe().refused_registrations(), 0u);
    EXPECT_EQ(c_.prefill->stats().peers, 1u);
  }
  expect_unharmed(bystander);
}

// Metadata for rooms that never come, from the liar: a few naming every page a room can have
// (kPages; a room's metadata names the decode rank's pages, so a prefill rank's own pool does not
// bound it: the frame limit does, and codec_limits_test checks the codec's refusal before allocating),
// then 70 000 without any. What the prefill rank keeps stays within the liar's quota of rooms, the
// rest is counted as dropped, and an honest decode rank's metadata for a room not added yet is
// still kept and used.
TEST_P(HostilePeer, MetadataFloodForUnknownRooms) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(36);
  constexpr size_t kBig = 8, kSmall = 70'000;
  std::vector<uint64_t> pages(kPages, 1);
  for (size_t i = 0; i < kBig; ++i)
    liar_send(pctl(), Message{RoomMetadata{100'001 + 2 * i, liar().self, pages, 0, {}, 1}});
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return c_.pe().pending_metadata() + c_.pe().dropped_pending() == kBig; }));
    EXPECT_EQ(c_.pe().pending_indices(), kBig * kPages);
    EXPECT_EQ(c_.pe().dropped_pending(), 0u);
  }
  for (size_t i = 0; i < kSmall && !(secret() && i > 2000); ++i)
    liar_send(pctl(), Message{RoomMetadata{200'001 + 2 * i, liar().self, {}, 0, {}, 1}});
  if (!secret()) {
    // The liar's quota fills and every other frame is counted as dropped: none is lost on the
    // way (a fresh-clone run once saw 1024 lost, the frames the liar's ControlSocket held while its
    // queue was full and dropped when its connect window ended; src/control/control_socket.cc
    // keeps them now that the connection is up).
    ASSERT_TRUE(c_.pump_until([&] {
      return c_.pe().pending_metadata() + c_.pe().dropped_pending() == kBig + kSmall;
    }, 300s)) << c_.pe().pending_metadata() << " kept, " << c_.pe().dropped_pending() << " dropped";
    EXPECT_EQ(c_.pe().pending_metadata(), PrefillEndpoint::kMaxPendingPerSender);
    EXPECT_EQ(c_.pe().pending_indices(), kBig * kPages);
  }
  // The honest decode rank's metadata arrives before the prefill rank has the room.
  const size_t kept = c_.pe().pending_metadata();
  HonestRoom h;
  h.id = 38;
  h.src = {1, 2, 3};
  h.dst = {4, 5, 6};
  h.rx = c_.decode->receiver(h.id).value();
  ASSERT_TRUE(h.rx->init().ok());
  ASSERT_TRUE(h.rx->send_metadata(h.dst, 3, {}).ok());
  ASSERT_TRUE(c_.pump_until([&] { return c_.pe().pending_metadata() == kept + 1; }))
      << "the honest metadata was not kept: " << logs_.matching("for a room not added yet dropped").substr(0, 400);
  h.tx = c_.prefill->sender(h.id).value();
  ASSERT_TRUE(h.tx->init(kRoomPages, 1).ok());
  ASSERT_TRUE(c_.pump_until([&] { return h.tx->poll() == KVPoll::WaitingForInput; })) << Cluster::fmt_room(h.tx, h.rx);
  finish_honest(h);
  expect_unharmed(bystander);
}

// A bootstrap PUT that registers the liar's control endpoint as the prefill rank. Without the
// secret the service takes it if its incarnation is not older than the entry's (anyone may
// register then, docs/security.md; the replacement is counted and logged); ranks already
// connected are not affected. With the secret the PUT and the liar's lookup are refused (401)
// and the entry still names the real rank.
TEST_P(HostilePeer, BootstrapPutOverwritingAnotherRank) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(40);
  BootstrapClient own(c_.bootstrap->address());  // the process's keys, as the ranks use
  auto real = own.lookup(0, 0, 0);
  ASSERT_TRUE(real.ok()) << real.status().str();
  EXPECT_EQ(real->control_endpoint, pctl());
  BootstrapClient liar_http(c_.bootstrap->address(), 2000, nullptr);  // no key: no MAC
  PrefillRankInfo forged = *real;
  forged.control_endpoint = liar().control->endpoint();
  forged.incarnation = 9;
  Status put = liar_http.register_rank(forged);
  auto peek = liar_http.lookup(0, 0, 0);
  auto after = own.lookup(0, 0, 0);
  ASSERT_TRUE(after.ok()) << after.status().str();
  if (secret()) {
    EXPECT_EQ(put.code(), ErrorCode::kInvalidArgument) << put.str();
    EXPECT_NE(put.message().find("not authorized"), std::string::npos) << put.str();
    EXPECT_FALSE(peek.ok());
    EXPECT_EQ(after->control_endpoint, pctl());
    EXPECT_EQ(after->incarnation, real->incarnation);
  } else {
    // Issue 31: an older incarnation never replaces a newer one (refused, counted); a newer one
    // does (anyone may register without the secret, docs/security.md), counted and logged.
    EXPECT_EQ(put.code(), ErrorCode::kInvalidArgument) << put.str();
    EXPECT_NE(put.message().find("older than the registered"), std::string::npos) << put.str();
    EXPECT_EQ(after->control_endpoint, pctl());
    EXPECT_EQ(c_.bootstrap->refused_overwrites(), 1u);
    forged.incarnation = real->incarnation + 1;
    Status newer = liar_http.register_rank(forged);
    EXPECT_TRUE(newer.ok()) << newer.str();
    auto replaced = own.lookup(0, 0, 0);
    ASSERT_TRUE(replaced.ok()) << replaced.status().str();
    EXPECT_EQ(replaced->control_endpoint, liar().control->endpoint());
    EXPECT_EQ(c_.bootstrap->overwrites(), 1u);
    EXPECT_EQ(logs_.count("bootstrap entry of engine_id 0 dp_rank 0 tp_rank 0 replaced"), 1u);
  }
  expect_unharmed(bystander);
}

// The liar learned the decode rank's data address (worker address and spans: its pool
// registration; here taken from the prefill rank's message hook) and connects a UCX tcp transport
// of its own to it. UCX's data path has no secret (docs/security.md), so its writes reach the
// decode rank with and without the secret; the room fence (docs/security.md "The room fence")
// refuses every write naming a room that is not open there or touching another room's pages:
// an earlier honest room, finished and released (a late write for a released room), a room id
// the decode rank never saw, another live room's name on the bystander's pages, and the
// bystander's name on the other room's pages. Nothing lands: both live rooms complete byte-exact.
TEST_P(HostilePeer, ForgedWriteNamingAnotherRoom) {
  HOSTILE_START();
  {
    HonestRoom done = start_honest(30);
    finish_honest(done);
  }  // its handles dropped: released at the next pump
  c_.pump_for(50ms);
  HonestRoom bystander = start_honest(32);
  HonestRoom other = start_honest(34);
  ASSERT_TRUE(liar().make_region(1 << 16).ok());
  std::memset(liar().region.base, 0x5a, liar().region.bytes);
  const PoolRegistration& reg = *c_.honest_registration;
  RemoteRegionInfo info;
  info.worker_address = reg.worker_address;
  for (const RegionSpan& sp : reg.spans) info.spans.push_back({sp.offset, sp.bytes, sp.base, sp.packed_rkey});
  auto peer = liar().transport->connect(info);
  ASSERT_TRUE(peer.ok()) << peer.status().str();
  auto page = [&](uint64_t p) { return reg.kv_offsets.at(0) + p * reg.page_bytes; };
  auto forge = [&](uint64_t room, uint64_t remote) {
    auto done = std::make_shared<std::promise<Status>>();
    auto f = done->get_future();
    liar().transport->write(*peer, room, {{0, remote, kPageBytes}}, [done](Status st) { done->set_value(st); });
    for (auto end = std::chrono::steady_clock::now() + 60s;
         f.wait_for(0s) != std::future_status::ready && std::chrono::steady_clock::now() < end;)
      c_.pump();
    EXPECT_EQ(f.wait_for(0s), std::future_status::ready) << "room " << room;
    return f.wait_for(0s) == std::future_status::ready ? f.get() : Status(ErrorCode::kInternal, "no answer");
  };
  const uint64_t before = c_.de().fence().refused();
  EXPECT_EQ(forge(30, page(bystander.dst[0])).code(), ErrorCode::kTransferError);     // released room
  EXPECT_EQ(forge(0x7777, page(bystander.dst[1])).code(), ErrorCode::kTransferError); // never seen
  EXPECT_EQ(forge(other.id, page(bystander.dst[2])).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(forge(bystander.id, page(other.dst[0])).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(c_.de().fence().refused() - before, 4u);
  EXPECT_EQ(c_.de().fence().refused_outside(), 2u);
  EXPECT_GE(logs_.count("room fence refused"), 1u) << logs_.matching("transport.fence");
  liar().transport->disconnect(*peer);
  finish_honest(other);
  expect_unharmed(bystander);
}

INSTANTIATE_TEST_SUITE_P(Cluster, HostilePeer, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "WithSecret" : "NoSecret"); });

}  // namespace
}  // namespace kvferry_itest
