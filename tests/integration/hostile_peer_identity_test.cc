// Issue 31: the second pass of the hostile-peer suite (docs/security.md, "Tests"; the cluster and
// the liar of hostile_peer_harness.h, the fixture of hostile_peer_fixture.h). A liar written from
// the wire format alone found five ways to hurt a rank without the cluster secret; each is a case
// here, run without and with the secret (with it, the liar is refused before anything is parsed,
// and expect_unharmed() checks that nothing of it reached a rank):
//   - registrations in the names of identities outside the transfer plan (decode TP 200+, of
//     engine 0 and of another engine, a DP rank the decode engine does not have),
//   - a re-registration under the live decode rank's own incarnation with a garbage worker address,
//   - a heartbeat in the decode rank's name with incarnation 2^63 and a registration from the far
//     future, and a restart claim while the real rank is alive,
//   - 600 refused registrations, each naming another control endpoint,
//   - a 128 MiB RoomMetadata.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <random>

#include "hostile_peer_fixture.h"

namespace kvferry_itest {
namespace {

size_t open_fds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

// 64 registrations of valid shape (the liar's real region and worker: on main each one was
// connected, watched, and later declared dead with a warning) as decode ranks outside the plan:
// TP ranks 200+ of engine 0, TP rank 200 of engine 3 (another decode engine_id is another decode
// instance since issue 34d: admitted within the plan), and DP rank 9 of a decode engine of DP 2.
// Each is refused before it is decoded: no connect, no peer, no "unreachable" warning, no answer.
TEST_P(HostilePeer, OutsideIdentitiesAreRefusedBeforeDecoding) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(50);
  ASSERT_TRUE(liar().make_region(registration_bytes(liar_registration(*c_.honest_registration, liar(), kPages))).ok());
  const size_t connections = c_.pcore().control().open_connections();
  constexpr size_t kOutside = 64;
  for (size_t i = 0; i < kOutside; ++i) {
    PoolRegistration r = liar_registration(*c_.honest_registration, liar(), kPages);
    r.sender = i < 60 ? RankId{Role::kDecode, 0, uint32_t(200 + i), 1}
                      : (i < 62 ? RankId{Role::kDecode, 3, 200, 1} : RankId{Role::kDecode, 0, 0, 9});
    liar_send(pctl(), Message{r});
  }
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return c_.pcore().refusals().count(Refusal::kOutsidePlan) == kOutside; }))
        << c_.pcore().refusals().count(Refusal::kOutsidePlan);
    c_.pump_for(300ms);  // a connect would have started by now
    EXPECT_EQ(c_.liar_frames_at_prefill, 0u) << "a frame of an outside identity was decoded";
    EXPECT_EQ(c_.pe().peers(), 1u);
    EXPECT_EQ(c_.pe().connecting_peers(), 0u);
    EXPECT_EQ(c_.pcore().control().open_connections(), connections);
    EXPECT_EQ(c_.pe().refused_registrations(), 0u);
    EXPECT_TRUE(liar().received.empty()) << "an outside identity was answered";
    // One warning for the kind, at most RefusalLog::kDebugLinesPerInterval more at debug: every
    // one is counted, not every one is a line (a flood fills no log file).
    EXPECT_EQ(logs_.count("refused: not a destination of"),
              std::min<uint64_t>(kOutside, 1 + RefusalLog::kDebugLinesPerInterval));
  }
  expect_unharmed(bystander);
  EXPECT_EQ(logs_.count("unreachable"), 0u) << logs_.matching("unreachable");
}

// The live decode rank's registration sent again under its own incarnation (in clear on the wire
// without the secret) with a garbage worker address and the liar's control endpoint: on main the
// working connection was torn down, its rooms failed and the garbage became the registration to
// reconnect with. Refused as a changed registration: the connection, its transport peer and its
// rooms go on; the liar gets no answer.
TEST_P(HostilePeer, SameIncarnationReRegistrationKeepsTheLivePeer) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(52);
  const RankId real_decode{Role::kDecode, 0, 0, 0};
  const std::optional<PeerId> before = c_.pe().transport_peer(real_decode);
  ASSERT_TRUE(before.has_value());
  PoolRegistration lie = *c_.honest_registration;  // the same incarnation
  std::mt19937 rng(31);
  lie.worker_address.assign(600, '\0');
  for (char& ch : lie.worker_address) ch = static_cast<char>(rng());
  lie.control_endpoint = liar().control->endpoint();
  liar_send(pctl(), Message{lie});
  lie.worker_address = c_.honest_registration->worker_address;  // a real one, but another pool's span
  lie.spans[0].bytes /= 2;
  liar_send(pctl(), Message{lie});
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return c_.pcore().refusals().count(Refusal::kChangedRegistration) == 2; }));
    EXPECT_EQ(c_.pe().transport_peer(real_decode), before);
    EXPECT_EQ(c_.pe().connecting_peers(), 0u);
    EXPECT_EQ(c_.pe().connected_peers(), 1u);
    EXPECT_EQ(liar().received_count<RegistrationRefusal>(), 0u);
  }
  for (uint64_t id = 60; id < 68; id += 2) {  // rooms keep succeeding on the kept connection
    HonestRoom h = start_honest(id);
    finish_honest(h);
  }
  expect_unharmed(bystander);
  EXPECT_EQ(c_.pe().transport_peer(real_decode), before);
  EXPECT_EQ(c_.pcore().incarnation_counts().peer_restarts, 0u);
}

// A heartbeat in the decode rank's name with incarnation 2^63 (on main: every later frame of the
// real rank was stale until the prefill restarted), a registration from 1 h in the future, and a
// restart claim with a plausible incarnation while the real rank is alive: the first two are
// refused and change nothing; the third is held, and refused once the live rank answers the
// challenge sent to its endpoint; it changes nothing either. The real rank's frames are still accepted: rooms keep succeeding.
TEST_P(HostilePeer, RestartClaimsNeedARegistrationAFewSecondsOfSkewAndADeadPredecessor) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(54);
  const RankId real_decode{Role::kDecode, 0, 0, 0};
  const std::optional<PeerId> before = c_.pe().transport_peer(real_decode);
  liar_send(pctl(), Message{Heartbeat{real_decode, 1, monotonic_ns(), 1ull << 63}});
  PoolRegistration future = *c_.honest_registration;
  future.incarnation = static_cast<uint64_t>(realtime_ns()) + 3600ull * 1'000'000'000;
  future.control_endpoint = liar().control->endpoint();
  liar_send(pctl(), Message{future});
  PoolRegistration plausible = future;
  plausible.incarnation = static_cast<uint64_t>(realtime_ns());
  liar_send(pctl(), Message{plausible});
  if (!secret()) {
    // The plausible claim is held and its old endpoint challenged: the live rank answers with the
    // known incarnation, and the claim is refused (held, then refused: two more).
    ASSERT_TRUE(c_.pump_until([&] {
      return c_.pcore().refusals().count(Refusal::kFutureIncarnation) == 1 &&
             c_.pcore().refusals().count(Refusal::kUnconfirmedRestart) >= 3 && c_.pe().pending_restarts() == 0;
    })) << c_.pcore().refusals().count(Refusal::kFutureIncarnation) << " "
        << c_.pcore().refusals().count(Refusal::kUnconfirmedRestart) << " " << c_.pe().pending_restarts();
    EXPECT_EQ(c_.pe().transport_peer(real_decode), before);
    EXPECT_EQ(c_.pcore().incarnation_counts().peer_restarts, 0u);
    EXPECT_TRUE(liar().received.empty());
  }
  for (uint64_t id = 70; id < 76; id += 2) {
    HonestRoom h = start_honest(id);
    finish_honest(h);
  }
  expect_unharmed(bystander);
  EXPECT_EQ(c_.pe().transport_peer(real_decode), before);
  EXPECT_EQ(c_.pcore().incarnation_counts().peer_restarts, 0u);
  EXPECT_EQ(c_.pcore().incarnation_counts().stale_total(), 0u);
}

// 600 refused registrations from the liar's identity (decode DP group 1, in the plan), each naming
// another control endpoint: 127.0.x.y on the port of a TCP listener of the test bound to every
// address, so any connect to any of them shows in its accept queue. The first refusal of the
// identity is told once at the liar's own endpoint; the 600 are never answered, nothing connects
// to the listener, and the process's file descriptors do not grow (on main: 42 -> 1242).
TEST_P(HostilePeer, RefusalFanOutOpensNoConnection) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(56);
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 1024), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const uint16_t port = ntohs(a.sin_port);
  PoolRegistration bad = liar_registration(*c_.honest_registration, liar(), kPages);
  bad.spans[0].bytes = registration_bytes(bad) / 2;  // refused by check_registration
  liar_send(pctl(), Message{bad});  // told once, at the liar's own endpoint
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return liar().received_count<RegistrationRefusal>() == 1; }));
  }
  c_.pump_for(100ms);
  const size_t fds = open_fds();
  const size_t connections = c_.pcore().control().open_connections();
  constexpr size_t kRefusals = 600;
  for (size_t i = 0; i < kRefusals; ++i) {
    bad.control_endpoint = "tcp://127.0." + std::to_string(1 + i / 250) + "." + std::to_string(1 + i % 250) + ":" +
                           std::to_string(port);
    liar_send(pctl(), Message{bad});
  }
  if (!secret()) {
    ASSERT_TRUE(c_.pump_until([&] { return c_.pe().refused_registrations() == 1 + kRefusals; }))
        << c_.pe().refused_registrations();
    c_.pump_for(500ms);  // a connect would have reached the listener by now
    pollfd p{listener, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 0) << "the prefill rank connected to an endpoint a refused frame named";
    EXPECT_EQ(c_.pcore().control().open_connections(), connections);
    EXPECT_LE(open_fds(), fds + 4) << "file descriptors grew from " << fds;
    EXPECT_EQ(liar().received_count<RegistrationRefusal>(), 1u);
    // One warning line for the kind, the rest at debug: all counted, on /metrics too.
    EXPECT_EQ(c_.pcore().refusals().count(Refusal::kBadRegistration), 1 + kRefusals);
  }
  ::close(listener);
  expect_unharmed(bystander);
}

// One RoomMetadata of 2^24 page indices (128 MiB) from an outside identity: ZeroMQ drops it at the
// prefill rank's frame limit (its pool's 16 pages plus a few MiB), so it is never received whole,
// decoded or refused by the plan (on main the limit was 129 MiB: it was taken in and decoded).
// The liar's next frame comes through a new connection and is parsed.
TEST_P(HostilePeer, FrameOf128MiBIsDroppedByTheFrameLimit) {
  HOSTILE_START();
  HonestRoom bystander = start_honest(58);
  ASSERT_LT(kFrameCap, 8u << 20);
  {
    std::string big = encode(Message{RoomMetadata{59, RankId{Role::kDecode, 0, 300, 0},
                                                  std::vector<uint64_t>(kMaxKvIndices, 1), 0, {}, 1, 7, 0}});
    ASSERT_GT(big.size(), 128u << 20);
    liar_send(pctl(), big);
  }
  if (!secret()) {
    const uint64_t before = c_.liar_frames_at_prefill;
    ASSERT_TRUE(c_.pump_until([&] {
      liar_send(pctl(), Message{Heartbeat{liar().self, 1, monotonic_ns(), 0}});
      c_.pump_for(50ms);
      return c_.liar_frames_at_prefill > before;
    }));
    EXPECT_EQ(c_.pcore().refusals().count(Refusal::kOutsidePlan), 0u) << "the 128 MiB frame was received";
    EXPECT_EQ(c_.pcore().refusals().count(Refusal::kMalformed), 0u);
    EXPECT_EQ(c_.pe().foreign_messages(), 0u);
  }
  expect_unharmed(bystander);
}

INSTANTIATE_TEST_SUITE_P(Cluster, HostilePeer, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "WithSecret" : "NoSecret"); });

}  // namespace
}  // namespace kvferry_itest
