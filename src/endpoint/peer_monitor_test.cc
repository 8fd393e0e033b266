// PeerMonitor: heartbeats really go out from its own thread; death is reported once, strictly
// after the timeout; a peer heard again is revived; watch() again resets; unwatch() stops it all.
#include "endpoint/peer_monitor.h"

#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "kvferry/control.h"
#include "kvferry/messages.h"
#include "kvferry/net.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kMs = 1'000'000;

Deadlines short_deadlines() {
  Deadlines d;
  d.heartbeat_interval_ms = 20;
  d.heartbeat_timeout_ms = 100;
  return d;
}

// Silences in wall time: these tests pass their own clock and check exact thresholds, which a
// stall of this process's heartbeat thread (credited on a loaded host) would shift.
const PeerMonitor::Options kExact{.stall_credit = false};

const RankId kSelf{Role::kPrefill, 0, 0, 0};
const RankId kPeer{Role::kDecode, 0, 0, 0};
const RankId kOther{Role::kDecode, 0, 1, 0};

// Heartbeats from `sender` received on `sock` within `window`.
// Heartbeats that arrive within `window`; returns early once `enough` came (an event, so a
// slow host or a sanitizer's slowdown only makes the wait longer, not the test fail).
std::vector<Heartbeat> collect(ControlSocket& sock, std::chrono::milliseconds window,
                               size_t enough = SIZE_MAX) {
  std::vector<Heartbeat> out;
  auto end = std::chrono::steady_clock::now() + window;
  while (std::chrono::steady_clock::now() < end && out.size() < enough) {
    auto f = sock.recv(10ms);
    if (!f) continue;
    auto m = decode(*f);
    EXPECT_TRUE(m.ok()) << m.status().str();
    if (m.ok())
      if (auto* hb = std::get_if<Heartbeat>(&*m)) out.push_back(*hb);
  }
  return out;
}

TEST(PeerMonitor, SendsHeartbeatsFromItsOwnThread) {
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok()) << sock.status().str();
  PeerMonitor m(kSelf, short_deadlines());
  m.watch(kPeer, (*sock)->endpoint());
  EXPECT_EQ(m.watched(), 1u);
  // The test thread never calls into the monitor while collecting: the beats come on their own.
  auto beats = collect(**sock, 30s, 5);
  ASSERT_GE(beats.size(), 5u);  // 20 ms interval: about 100 ms on an idle host
  for (size_t i = 0; i < beats.size(); ++i) {
    EXPECT_EQ(beats[i].sender, kSelf);
    if (i > 0) {
      EXPECT_GT(beats[i].seq, beats[i - 1].seq);
      EXPECT_GE(beats[i].sent_ns, beats[i - 1].sent_ns);
    }
  }
}

TEST(PeerMonitor, DeadStrictlyAfterTheTimeoutAndReportedOnce) {
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, "tcp://127.0.0.1:1");
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  EXPECT_TRUE(m.take_dead(t + 50 * kMs).empty());
  EXPECT_TRUE(m.take_dead(t + 100 * kMs).empty());  // exactly the timeout: not yet
  auto dead = m.take_dead(t + 100 * kMs + 1);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].peer, kPeer);
  EXPECT_EQ(dead[0].silent_ms, 100);
  EXPECT_TRUE(m.take_dead(t + 500 * kMs).empty());  // once, not every tick
  EXPECT_TRUE(m.take_revived().empty());
  EXPECT_EQ(m.watched(), 1u);  // still watched (heartbeats keep going to it)
}

TEST(PeerMonitor, HeardAgainIsRevivedOnceAndCanDieAgain) {
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, "tcp://127.0.0.1:1");
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  ASSERT_EQ(m.take_dead(t + 200 * kMs).size(), 1u);
  m.heard(kPeer, t + 300 * kMs, /*proven=*/true);  // its answer to a challenge
  auto revived = m.take_revived();
  ASSERT_EQ(revived.size(), 1u);
  EXPECT_EQ(revived[0], kPeer);
  EXPECT_TRUE(m.take_revived().empty());
  EXPECT_TRUE(m.take_dead(t + 350 * kMs).empty());
  auto again = m.take_dead(t + 450 * kMs);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].silent_ms, 150);
}

// Issue 31: without the secret anyone can send a heartbeat in a dead peer's name. Before, one such
// frame revived it (its registration was sent again, its rooms waited) and it was declared dead
// again after the timeout, so a liar kept a dead peer flapping. Now a frame that is not the peer's
// answer to a challenge only asks for one (take_unproven(), once) and changes nothing.
TEST(PeerMonitor, AnUnprovenFrameFromADeadPeerDoesNotReviveIt) {
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, "tcp://127.0.0.1:1");
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  ASSERT_EQ(m.take_dead(t + 200 * kMs).size(), 1u);
  EXPECT_TRUE(m.take_unproven().empty());
  m.heard(kPeer, t + 300 * kMs);  // a forged heartbeat
  m.heard(kPeer, t + 310 * kMs);
  EXPECT_TRUE(m.take_revived().empty());
  EXPECT_EQ(m.last_heard_ns(kPeer), t);
  auto unproven = m.take_unproven();
  ASSERT_EQ(unproven.size(), 1u);
  EXPECT_EQ(unproven[0], kPeer);
  EXPECT_TRUE(m.take_unproven().empty());
  EXPECT_TRUE(m.take_dead(t + 400 * kMs).empty());  // still dead, not reported twice
  EXPECT_EQ(m.stats().revived, 0u);
  m.heard(kPeer, t + 500 * kMs, /*proven=*/true);
  EXPECT_EQ(m.take_revived().size(), 1u);
}

TEST(PeerMonitor, HeardWithoutDeathIsNotARevival) {
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, "tcp://127.0.0.1:1");
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  m.heard(kPeer, t + 50 * kMs);
  EXPECT_TRUE(m.take_revived().empty());
  EXPECT_TRUE(m.take_dead(t + 140 * kMs).empty());  // the clock restarted at t + 50 ms
  EXPECT_EQ(m.take_dead(t + 151 * kMs).size(), 1u);
}

TEST(PeerMonitor, OnlyTheSilentPeerDies) {
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, "tcp://127.0.0.1:1");
  m.watch(kOther, "tcp://127.0.0.1:2");
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  m.heard(kOther, t + 80 * kMs);
  auto dead = m.take_dead(t + 150 * kMs);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].peer, kPeer);
  auto later = m.take_dead(t + 181 * kMs);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].peer, kOther);
}

TEST(PeerMonitor, WatchAgainResetsAndUnwatchForgets) {
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, "tcp://127.0.0.1:1");
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  ASSERT_EQ(m.take_dead(t + 200 * kMs).size(), 1u);
  m.watch(kPeer, "tcp://127.0.0.1:3");  // the peer restarted and registered again
  const int64_t w = monotonic_ns();
  EXPECT_TRUE(m.take_dead(w + 50 * kMs).empty());
  EXPECT_TRUE(m.take_revived().empty());  // a new watch is not a revival
  EXPECT_EQ(m.take_dead(w + 1000 * kMs).size(), 1u);

  m.unwatch(kPeer);
  EXPECT_EQ(m.watched(), 0u);
  m.heard(kPeer, w);  // a frame from a peer no longer watched is ignored
  EXPECT_TRUE(m.take_dead(w + 10'000 * kMs).empty());
  EXPECT_TRUE(m.take_revived().empty());
}

TEST(PeerMonitor, UnwatchStopsHeartbeats) {
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok());
  PeerMonitor m(kSelf, short_deadlines());
  m.watch(kPeer, (*sock)->endpoint());
  ASSERT_FALSE(collect(**sock, 30s, 1).empty());
  m.unwatch(kPeer);
  // At most one beat was already on its way (the heartbeat thread took its list of endpoints
  // before the unwatch), however late it arrives; watched, 25 would be due in this window.
  EXPECT_LE(collect(**sock, 500ms).size(), 1u);
}

}  // namespace
}  // namespace kvferry

namespace kvferry {
namespace {

// A peer silent past the timeout whose control endpoint still accepts connections is alive but
// not scheduled (a loaded host): not declared dead until it stays silent kHungFactor x the
// timeout. A naive monitor (silence alone) reports it at 100 ms + 1 ns.
TEST(PeerMonitor, SilentPeerWhoseEndpointAcceptsIsNotDeadUntilHung) {
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok()) << sock.status().str();
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, (*sock)->endpoint());
  m.watch(kOther, "tcp://127.0.0.1:1");  // nothing listens: a killed process
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  m.heard(kOther, t);
  auto dead = m.take_dead(t + 100 * kMs + 1);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].peer, kOther);
  EXPECT_TRUE(m.take_dead(t + 250 * kMs).empty());
  EXPECT_TRUE(m.take_dead(t + PeerMonitor::kHungFactor * 100 * kMs).empty());
  dead = m.take_dead(t + PeerMonitor::kHungFactor * 100 * kMs + 1);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].peer, kPeer);
}

// Once the peer's process is gone (its socket closed), the next probe confirms the suspicion.
TEST(PeerMonitor, SuspectIsConfirmedOnceItsEndpointCloses) {
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok()) << sock.status().str();
  const std::string ep = (*sock)->endpoint();
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, ep);
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  EXPECT_TRUE(m.take_dead(t + 150 * kMs).empty());
  sock->reset();  // ZeroMQ closes the listening socket on its I/O thread, soon after
  std::vector<DeadPeer> dead;
  for (int i = 0; i < 100 && dead.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(PeerMonitor::kProbeIntervalMs / 5));
    dead = m.take_dead(t + 200 * kMs);
  }
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].peer, kPeer);
}

TEST(PeerMonitor, EndpointAccepts) {
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok()) << sock.status().str();
  EXPECT_TRUE(PeerMonitor::endpoint_accepts((*sock)->endpoint(), 100));
  EXPECT_FALSE(PeerMonitor::endpoint_accepts("tcp://127.0.0.1:1", 100));
  EXPECT_FALSE(PeerMonitor::endpoint_accepts("ipc:///tmp/x", 100));
  EXPECT_FALSE(PeerMonitor::endpoint_accepts("tcp://127.0.0.1:99999", 100));
  EXPECT_FALSE(PeerMonitor::endpoint_accepts("tcp://127.0.0.1:12x", 100));
}

// A TCP port bound on `host` but not listening: connects to it are refused, and nobody else can
// take it while it is held.
struct RefusingPort {
  int fd = -1;
  uint16_t port = 0;
  explicit RefusingPort(const char* host) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
    addrinfo* res = nullptr;
    if (::getaddrinfo(host, "0", &hints, &res) != 0) return;
    fd = ::socket(res->ai_family, SOCK_STREAM, 0);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    }
    ::freeaddrinfo(res);
  }
  ~RefusingPort() {
    if (fd >= 0) ::close(fd);
  }
};

// A TCP port on 127.0.0.1 that listens but never answers a new connect: its accept queue (backlog
// 0: one connection) is full, so the kernel drops further SYNs silently, as a partition does.
struct SilentPort {
  int fd = -1, queued = -1;
  uint16_t port = 0;
  SilentPort() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 0) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      return;
    queued = ::socket(AF_INET, SOCK_STREAM, 0);  // fills the queue (never accepted)
    if (queued >= 0 && ::connect(queued, reinterpret_cast<sockaddr*>(&addr), len) == 0) port = ntohs(addr.sin_port);
  }
  ~SilentPort() {
    if (queued >= 0) ::close(queued);
    if (fd >= 0) ::close(fd);
  }
};

// The probe tells a live process, a gone one and a silent network apart.
TEST(PeerMonitor, ProbeTellsAcceptedRefusedAndUnanswered) {
  using P = PeerMonitor::Probe;
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok()) << sock.status().str();
  RefusingPort refused("127.0.0.1");
  SilentPort silent;
  ASSERT_NE(refused.port, 0);
  ASSERT_NE(silent.port, 0);
  EXPECT_EQ(PeerMonitor::probe((*sock)->endpoint(), 100), P::kAccepts);
  EXPECT_EQ(PeerMonitor::probe(zmq_endpoint("127.0.0.1", refused.port), 100), P::kRefused);
  EXPECT_EQ(PeerMonitor::probe(zmq_endpoint("127.0.0.1", silent.port), 30), P::kUnanswered);
  EXPECT_EQ(PeerMonitor::probe("ipc:///tmp/x", 100), P::kRefused);  // cannot be probed
}

// A peer behind a silent network (the probe is never answered) is reported after
// kUnreachableFactor x the timeout, not at the timeout: a short link outage leaves the heartbeat
// stream silent for longer than the outage (TCP's retransmission backoff), and must cost nothing.
TEST(PeerMonitor, SilentNetworkIsReportedAfterTheUnreachableFactor) {
  SilentPort silent;
  ASSERT_NE(silent.port, 0);
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, zmq_endpoint("127.0.0.1", silent.port));
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  EXPECT_TRUE(m.take_dead(t + 100 * kMs + 1).empty());
  EXPECT_TRUE(m.take_dead(t + PeerMonitor::kUnreachableFactor * 100 * kMs).empty());
  auto dead = m.take_dead(t + PeerMonitor::kUnreachableFactor * 100 * kMs + 1);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].peer, kPeer);
  EXPECT_EQ(m.stats().probed_silent, 1u);
  EXPECT_EQ(m.stats().probed_alive, 0u);
}

TEST(PeerMonitor, EndpointAcceptsIpv6) {
  ListenAddress v6;
  v6.bind_host = "::1";
  auto sock = ControlSocket::bind(v6);
  ASSERT_TRUE(sock.ok()) << sock.status().str();
  ASSERT_EQ((*sock)->endpoint().rfind("tcp://[::1]:", 0), 0u) << (*sock)->endpoint();
  EXPECT_TRUE(PeerMonitor::endpoint_accepts((*sock)->endpoint(), 100));
  RefusingPort refused("::1");
  ASSERT_NE(refused.port, 0);
  EXPECT_FALSE(PeerMonitor::endpoint_accepts(zmq_endpoint("::1", refused.port), 100));
  EXPECT_FALSE(PeerMonitor::endpoint_accepts("tcp://::1:5000", 100));  // no brackets: unparsable
  EXPECT_FALSE(PeerMonitor::endpoint_accepts("tcp://[::]:5000", 100));  // a wildcard is no peer
}

TEST(PeerMonitor, EndpointAcceptsHostName) {
  auto sock = ControlSocket::bind("tcp://localhost:0");
  ASSERT_TRUE(sock.ok()) << sock.status().str();
  ASSERT_EQ((*sock)->endpoint().rfind("tcp://localhost:", 0), 0u) << (*sock)->endpoint();
  EXPECT_TRUE(PeerMonitor::endpoint_accepts((*sock)->endpoint(), 100));
  // Refused on every address "localhost" has (IPv4 here; IPv6 too where it resolves to ::1).
  RefusingPort refused("127.0.0.1");
  ASSERT_NE(refused.port, 0);
  EXPECT_FALSE(PeerMonitor::endpoint_accepts("tcp://localhost:" + std::to_string(refused.port), 100));
  EXPECT_FALSE(PeerMonitor::endpoint_accepts("tcp://no-such-host.invalid:5000", 100));
  EXPECT_FALSE(PeerMonitor::endpoint_accepts("tcp://localhost:0", 100));
}

// A dead peer on IPv6 is reported after the timeout (the probe is refused); a live one is not.
TEST(PeerMonitor, ProbeOverIpv6ConfirmsDeathOnly) {
  ListenAddress v6;
  v6.bind_host = "::1";
  auto sock = ControlSocket::bind(v6);
  ASSERT_TRUE(sock.ok()) << sock.status().str();
  RefusingPort gone("::1");
  ASSERT_NE(gone.port, 0);
  PeerMonitor m(kSelf, short_deadlines(), v6, kExact);
  m.watch(kPeer, (*sock)->endpoint());             // silent but listening: a busy peer
  m.watch(kOther, zmq_endpoint("::1", gone.port));  // refused: a killed one
  const int64_t t = monotonic_ns();
  auto dead = m.take_dead(t + 150 * kMs);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].peer, kOther);
  // The heartbeats of a monitor bound on IPv6 reach an IPv6 peer.
  auto beats = collect(**sock, 30s, 2);
  EXPECT_GE(beats.size(), 2u);
}

// Busy is not dead: a stall of this process (its heartbeat thread woke 2 s late, as when the whole
// host was descheduled) is not counted as the peer's silence, which is reported once it has
// lasted the timeout while this process ran (without the credit: at 100 ms + 1 ns).
TEST(PeerMonitor, OwnStallIsNotThePeersSilence) {
  Deadlines d = short_deadlines();
  d.heartbeat_interval_ms = 500;  // the real thread's first wake-up comes long after this test
  PeerMonitor m(kSelf, d, {}, PeerMonitor::Options{.stall_credit = true});
  m.watch(kPeer, "tcp://127.0.0.1:1");  // refused: only the silence decides
  const int64_t t = monotonic_ns();
  m.heard(kPeer, t);
  m.tick_stall_clock(t + 10 * kMs);
  m.tick_stall_clock(t + 3010 * kMs);  // 3000 ms between wake-ups: 2000 ms beyond 2 x 500 ms
  EXPECT_TRUE(m.take_dead(t + 2100 * kMs).empty());  // awake for 100 ms of its silence only
  auto dead = m.take_dead(t + 2100 * kMs + 1);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].silent_ms, 2100);  // the report gives the whole silence
  const LivenessStats s = m.stats();
  EXPECT_GE(s.stalled_ms, 2000.0);
  EXPECT_GE(s.max_stall_ms, 2000.0);
  EXPECT_EQ(s.reported, 1u);
}

// stats(): gaps between frames of a peer (p50, p99, max), suspicions, busy peers found alive by
// the probe, reports and revivals, counted once each.
TEST(PeerMonitor, StatsCountWhatTheLivenessPathSaw) {
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok()) << sock.status().str();
  PeerMonitor m(kSelf, short_deadlines(), {}, kExact);
  m.watch(kPeer, (*sock)->endpoint());  // listening: busy, never reported before kHungFactor
  m.watch(kOther, "tcp://127.0.0.1:1");
  const int64_t t = monotonic_ns();
  for (int i = 0; i < 100; ++i) m.heard(kPeer, t + i * 10 * kMs);  // 99 gaps of 10 ms
  m.heard(kPeer, t + 1490 * kMs);                                    // one of 500 ms
  EXPECT_EQ(m.take_dead(t + 1500 * kMs).size(), 1u);  // kOther: refused
  EXPECT_TRUE(m.take_dead(t + 1700 * kMs).empty());    // kPeer: suspected, alive
  EXPECT_TRUE(m.take_dead(t + 1710 * kMs).empty());
  m.heard(kOther, t + 1800 * kMs, /*proven=*/true);  // reported, then heard again (its first frame: no gap)
  const LivenessStats s = m.stats();
  EXPECT_EQ(s.gaps, 100u);
  EXPECT_NEAR(s.gap_p50_ms, 10.0, 1.0);
  EXPECT_NEAR(s.gap_p99_ms, 10.0, 1.0);
  EXPECT_NEAR(s.gap_max_ms, 500.0, 0.01);
  EXPECT_EQ(s.suspected, 2u);
  EXPECT_EQ(s.probed_alive, 1u);
  EXPECT_EQ(s.reported, 1u);
  EXPECT_EQ(s.revived, 1u);
  EXPECT_EQ(s.stalled_ms, 0.0);
}

// The heartbeat thread runs raised (as root, as here and in CI); never below its old priority.
TEST(PeerMonitor, HeartbeatThreadRunsRaisedWherePermitted) {
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok());
  PeerMonitor m(kSelf, short_deadlines());
  m.watch(kPeer, (*sock)->endpoint());
  ASSERT_FALSE(collect(**sock, 30s, 1).empty());  // the thread is up and beating
  LivenessStats s = m.stats();
  // ZeroMQ's I/O thread may be named only after the first beat: the monitor looks again at every
  // beat until it finds it (an event with a deadline, not a window).
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (geteuid() == 0 && s.io_nice != PeerMonitor::kLivenessNice &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    s = m.stats();
  }
  if (geteuid() == 0) {
    EXPECT_EQ(s.heartbeat_nice, PeerMonitor::kLivenessNice);
    EXPECT_EQ(s.io_nice, PeerMonitor::kLivenessNice);
  } else {
    EXPECT_LE(s.heartbeat_nice, 0);
  }
}

}  // namespace
}  // namespace kvferry
