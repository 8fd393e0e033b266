#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <optional>
#include <thread>
#include <vector>

#include "kvferry/control.h"
#include "kvferry/net.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::unique_ptr<ControlSocket> bind_local() {
  auto r = ControlSocket::bind("tcp://127.0.0.1:0");
  EXPECT_TRUE(r.ok()) << r.status().str();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Receives one frame on `to`, waiting up to 2 s. Like a real owner loop, the sender keeps calling
// recv() meanwhile, so a frame it held while its connection came up gets flushed. The tests send
// one way at a time, so the sender must not receive anything here.
// The frame `to` receives from `from`, waiting up to a deadline far beyond any delivery (a
// connect and ZeroMQ's reconnect on a saturated machine): nullopt means it never came.
std::optional<std::string> deliver(ControlSocket& from, ControlSocket& to) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto f = to.recv(10ms)) return f;
    EXPECT_EQ(from.recv(0ms), std::nullopt);
  }
  return std::nullopt;
}

TEST(ControlSocket, BindResolvesPort) {
  auto a = bind_local();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << a->endpoint();
  EXPECT_NE(a->endpoint(), "tcp://127.0.0.1:0");
  EXPECT_GE(a->fd(), 0);
  EXPECT_EQ(a->open_connections(), 0u);
  auto star = ControlSocket::bind("tcp://127.0.0.1:*");
  ASSERT_TRUE(star.ok()) << star.status().str();
  EXPECT_EQ((*star)->endpoint().find('*'), std::string::npos);
}

TEST(ControlSocket, BindErrors) {
  auto a = bind_local();
  ASSERT_TRUE(a);
  auto again = ControlSocket::bind(a->endpoint());  // port taken
  EXPECT_FALSE(again.ok());
  auto bad = ControlSocket::bind("nonsense://x");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
}

TEST(ControlSocket, ExchangeBothWays) {
  auto a = bind_local();
  auto b = bind_local();
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->send(b->endpoint(), "hello b").ok());
  EXPECT_EQ(deliver(*a, *b), "hello b");
  ASSERT_TRUE(b->send(a->endpoint(), std::string("hi\0a", 4)).ok());
  EXPECT_EQ(deliver(*b, *a), std::string("hi\0a", 4));
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(a->send(b->endpoint(), std::to_string(i)).ok());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(deliver(*a, *b), std::to_string(i));  // in order
  EXPECT_EQ(b->recv(0ms), std::nullopt);
  EXPECT_EQ(a->open_connections(), 1u);
  EXPECT_EQ(b->open_connections(), 1u);
}

TEST(ControlSocket, CountsFramesAndBytesBothWays) {
  auto a = bind_local();
  auto b = bind_local();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->counters().frames_sent, 0u);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(a->send(b->endpoint(), "12345").ok());
  for (int i = 0; i < 10; ++i) ASSERT_EQ(deliver(*a, *b), "12345");
  EXPECT_EQ(b->recv(0ms), std::nullopt);  // nothing more: not counted
  const ControlSocket::Counters ca = a->counters(), cb = b->counters();
  EXPECT_EQ(ca.frames_sent, 10u);
  EXPECT_EQ(ca.bytes_sent, 50u);
  EXPECT_EQ(ca.frames_received, 0u);
  EXPECT_EQ(cb.frames_received, 10u);
  EXPECT_EQ(cb.bytes_received, 50u);
  EXPECT_EQ(cb.frames_sent, 0u);
  // A frame send() refuses is not counted.
  EXPECT_FALSE(a->send("nonsense://x", "zz").ok());
  EXPECT_EQ(a->counters().frames_sent, 10u);
}

TEST(ControlSocket, RecvTimesOutWhenIdle) {
  auto a = bind_local();
  ASSERT_TRUE(a);
  const auto t0 = Clock::now();
  EXPECT_EQ(a->recv(30ms), std::nullopt);
  const auto waited = Clock::now() - t0;
  EXPECT_GE(waited, 25ms);
  EXPECT_LT(waited, 2000ms);
}

TEST(ControlSocket, FdBecomesReadable) {
  auto a = bind_local();
  auto b = bind_local();
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->send(b->endpoint(), "x").ok());
  // ZMQ_FD is edge-style: poll it, then drain with recv(0) until empty.
  pollfd p{b->fd(), POLLIN, 0};
  std::optional<std::string> got;
  for (int i = 0; i < 200 && !got; ++i) {
    ::poll(&p, 1, 10);
    got = b->recv(0ms);
    EXPECT_EQ(a->recv(0ms), std::nullopt);  // lets `a` flush if its connection was slow
  }
  EXPECT_EQ(got, "x");
}

// A TCP port that is bound but not listening: connects to it are refused, and nobody else can
// take it while `fd` is open.
struct ReservedPort {
  int fd = -1;
  uint16_t port = 0;
  ReservedPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
  }
  ~ReservedPort() {
    if (fd >= 0) ::close(fd);
  }
};

TEST(ControlSocket, SendToNobodyDoesNotBlock) {
  auto a = bind_local();
  ASSERT_TRUE(a);
  ReservedPort nobody;
  ASSERT_NE(nobody.port, 0);
  const std::string dead = "tcp://127.0.0.1:" + std::to_string(nobody.port);
  // Within the connect window the frame is held (dropped later), never waited on for long.
  const auto t0 = Clock::now();
  Status first = a->send(dead, "lost");
  EXPECT_LT(Clock::now() - t0, 100ms);
  EXPECT_TRUE(first.ok() || first.code() == ErrorCode::kPeerUnreachable) << first.str();
  EXPECT_EQ(a->recv(0ms), std::nullopt);
  // Once the window is over (1 s), sends fail at once and nothing is held.
  std::this_thread::sleep_for(1100ms);
  const auto t1 = Clock::now();
  for (int i = 0; i < 10; ++i) {
    Status s = a->send(dead, "lost");
    EXPECT_EQ(s.code(), ErrorCode::kPeerUnreachable) << s.str();
  }
  EXPECT_LT(Clock::now() - t1, 100ms);
  EXPECT_EQ(a->open_connections(), 1u);
}

// A frame sent while the first connection is still being set up reaches the peer once it is up,
// as long as the sender keeps calling send()/recv().
TEST(ControlSocket, HeldFramesFlushWhenPeerComesUp) {
  auto a = bind_local();
  ASSERT_TRUE(a);
  std::string ep;
  std::optional<ReservedPort> later;
  later.emplace();
  ASSERT_NE(later->port, 0);
  ep = "tcp://127.0.0.1:" + std::to_string(later->port);
  ASSERT_TRUE(a->send(ep, "one").ok());  // refused for now: held
  ASSERT_TRUE(a->send(ep, "two").ok());
  later.reset();  // free the port and start the peer there
  auto b = ControlSocket::bind(ep);
  ASSERT_TRUE(b.ok()) << b.status().str();
  // The sender's own loop (here: recv with a timeout) flushes held frames when connected.
  std::vector<std::string> got;
  for (int i = 0; i < 40 && got.size() < 2; ++i) {
    a->recv(20ms);
    while (auto f = (*b)->recv(0ms)) got.push_back(*f);
  }
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two"}));
}

// A peer that does not read: frames fill ZeroMQ's queue and then the held frames of the connect
// window. Every frame send() accepted arrives once the peer reads, also when it starts reading
// only after the window ended (a socket that had connected does not drop what it held).
TEST(ControlSocket, FramesAcceptedIntoAFullQueueAreNotDropped) {
  auto a = bind_local();
  auto b = bind_local();
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->send(b->endpoint(), "first").ok());
  ASSERT_EQ(deliver(*a, *b), "first");  // connected
  const std::string frame(1024, 'x');
  size_t accepted = 1;  // "first"
  bool refused = false;
  // Until a send is refused (the queue and the held frames are full), or the connect window
  // (1 s from the first send) would be over: then nothing more can be held.
  const auto window_end = Clock::now() + 800ms;
  while (!refused && Clock::now() < window_end && accepted < 2'000'000) {
    if (a->send(b->endpoint(), frame).ok()) ++accepted;
    else refused = true;
  }
  std::this_thread::sleep_for(1200ms);  // the window is over: held frames must still be kept
  size_t got = 1;
  // Read until every accepted frame came, or until 10 s passed without one although the sender
  // flushed in between (progress, not a total time: under TSan the drain alone takes minutes).
  auto last_frame = Clock::now();
  while (got < accepted && Clock::now() - last_frame < 10s) {
    EXPECT_EQ(a->recv(0ms), std::nullopt);  // the sender's loop flushes what it held
    while (auto f = b->recv(5ms)) {
      EXPECT_EQ(*f, frame);
      ++got;
      last_frame = Clock::now();
    }
  }
  EXPECT_EQ(got, accepted) << (refused ? "the queue filled" : "the queue did not fill in the window");
  EXPECT_EQ(b->recv(100ms), std::nullopt);
}

TEST(ControlSocket, InvalidDestination) {
  auto a = bind_local();
  ASSERT_TRUE(a);
  Status s = a->send("bogus-endpoint", "x");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.str();
  EXPECT_EQ(a->open_connections(), 0u);
}

TEST(ControlSocket, ForgetThenRestartedPeerOnSamePort) {
  auto a = bind_local();
  auto b = bind_local();
  ASSERT_TRUE(a && b);
  const std::string ep = b->endpoint();
  ASSERT_TRUE(a->send(ep, "first").ok());
  ASSERT_EQ(deliver(*a, *b), "first");

  b.reset();  // the peer dies
  std::this_thread::sleep_for(20ms);
  a->forget(ep);
  EXPECT_EQ(a->open_connections(), 0u);

  // The peer restarts on the same port. ZeroMQ closes a listener asynchronously, so the port
  // may stay taken for a moment after the old socket is gone.
  auto restarted = ControlSocket::bind(ep);
  for (int i = 0; i < 100 && !restarted.ok(); ++i) {
    std::this_thread::sleep_for(10ms);
    restarted = ControlSocket::bind(ep);
  }
  ASSERT_TRUE(restarted.ok()) << restarted.status().str();
  auto& b2 = *restarted;
  ASSERT_EQ(b2->endpoint(), ep);
  ASSERT_TRUE(a->send(ep, "second").ok());
  EXPECT_EQ(deliver(*a, *b2), "second");
  EXPECT_EQ(a->open_connections(), 1u);
}

// --- Addresses (kvferry/net.h): IPv6, host names, wildcards that advertise a given host. ---

std::unique_ptr<ControlSocket> bind_at(const ListenAddress& a) {
  auto r = ControlSocket::bind(a);
  EXPECT_TRUE(r.ok()) << a.bind_host << ": " << r.status().str();
  return r.ok() ? std::move(r).value() : nullptr;
}

ListenAddress at(std::string bind_host, std::string advertise_host = "") {
  ListenAddress a;
  a.bind_host = std::move(bind_host);
  a.advertise_host = std::move(advertise_host);
  return a;
}

// Frames go both ways between `a` and `b` through their advertised endpoints.
void expect_exchange(ControlSocket& a, ControlSocket& b) {
  ASSERT_TRUE(a.send(b.endpoint(), "to b").ok()) << b.endpoint();
  EXPECT_EQ(deliver(a, b), "to b") << a.endpoint() << " -> " << b.endpoint();
  ASSERT_TRUE(b.send(a.endpoint(), "to a").ok()) << a.endpoint();
  EXPECT_EQ(deliver(b, a), "to a") << b.endpoint() << " -> " << a.endpoint();
}

uint16_t port_of(const ControlSocket& s) {
  auto hp = parse_host_port(s.endpoint());
  EXPECT_TRUE(hp.ok()) << s.endpoint();
  return hp.ok() ? hp->port : 0;
}

TEST(ControlSocket, Ipv6Loopback) {
  auto v6 = bind_at(at("::1"));
  auto v4 = bind_local();
  ASSERT_TRUE(v6 && v4);
  EXPECT_EQ(v6->endpoint(), zmq_endpoint("::1", port_of(*v6)));
  EXPECT_EQ(v6->endpoint().rfind("tcp://[::1]:", 0), 0u) << v6->endpoint();
  EXPECT_EQ(v6->bound_endpoint(), v6->endpoint());
  expect_exchange(*v4, *v6);  // an IPv4 socket sends to IPv6 and back
  auto v6b = ControlSocket::bind("tcp://[::1]:0");
  ASSERT_TRUE(v6b.ok()) << v6b.status().str();
  expect_exchange(*v6, **v6b);
}

TEST(ControlSocket, HostName) {
  auto named = bind_at(at("localhost"));
  auto v4 = bind_local();
  ASSERT_TRUE(named && v4);
  EXPECT_EQ(named->endpoint(), "tcp://localhost:" + std::to_string(port_of(*named)));
  expect_exchange(*v4, *named);
  auto named2 = ControlSocket::bind("tcp://localhost:0");
  ASSERT_TRUE(named2.ok()) << named2.status().str();
  expect_exchange(*named, **named2);
}

TEST(ControlSocket, WildcardBindAdvertisesGivenHost) {
  auto any4 = bind_at(at("0.0.0.0", "127.0.0.1"));
  ASSERT_TRUE(any4);
  const uint16_t port = port_of(*any4);
  EXPECT_NE(port, 0);
  EXPECT_EQ(any4->endpoint(), "tcp://127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(any4->bound_endpoint(), "tcp://0.0.0.0:" + std::to_string(port));
  auto any6 = bind_at(at("::", "::1"));
  ASSERT_TRUE(any6);
  EXPECT_EQ(any6->endpoint(), zmq_endpoint("::1", port_of(*any6)));
  expect_exchange(*any4, *any6);
  // The dual-stack wildcard is reachable over IPv4 too.
  auto v4 = bind_local();
  ASSERT_TRUE(v4);
  const std::string over_v4 = "tcp://127.0.0.1:" + std::to_string(port_of(*any6));
  ASSERT_TRUE(v4->send(over_v4, "v4 to ::").ok());
  EXPECT_EQ(deliver(*v4, *any6), "v4 to ::");
  // Without an advertise host, a wildcard advertises the machine's host name.
  auto named = bind_at(at("*"));
  ASSERT_TRUE(named);
  EXPECT_EQ(named->endpoint(), zmq_endpoint(ListenAddress{"*", "", 0}.advertised(), port_of(*named)));
  EXPECT_EQ(named->endpoint().find('*'), std::string::npos) << named->endpoint();
}

TEST(ControlSocket, FixedPortOnIpv6) {
  auto first = bind_at(at("::1"));
  ASSERT_TRUE(first);
  ListenAddress same = at("::1");
  same.port = port_of(*first);
  auto taken = ControlSocket::bind(same);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().code(), ErrorCode::kInternal) << taken.status().str();
}

TEST(ControlSocket, BadAddresses) {
  for (const ListenAddress& a : {at("bad host"), at("no-such-host.invalid"), at("::1", "0.0.0.0"),
                                 at("127.0.0.1", "not valid"), at("[127.0.0.1]")}) {
    auto r = ControlSocket::bind(a);
    ASSERT_FALSE(r.ok()) << a.bind_host << " / " << a.advertise_host;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().str();
  }
  auto not_local = ControlSocket::bind(at("192.0.2.1"));  // TEST-NET-1: no interface has it
  ASSERT_FALSE(not_local.ok());
  EXPECT_EQ(not_local.status().code(), ErrorCode::kInternal) << not_local.status().str();
  auto bad_endpoint = ControlSocket::bind("tcp://::1:0");  // IPv6 without brackets
  ASSERT_FALSE(bad_endpoint.ok());
  EXPECT_EQ(bad_endpoint.status().code(), ErrorCode::kInvalidArgument) << bad_endpoint.status().str();
}

}  // namespace
}  // namespace kvferry

namespace kvferry {
namespace {

std::unique_ptr<ControlSocket> bind_limited(const ControlLimits& limits) {
  ListenAddress a;
  a.bind_host = "127.0.0.1";
  auto r = ControlSocket::bind(a, nullptr, limits);
  EXPECT_TRUE(r.ok()) << r.status().str();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Issue 31: a frame above the receiver's limit drops its connection before any of it is kept;
// the next frame of the sender comes through on a new connection.
TEST(ControlSocketLimits, FrameAboveTheLimitIsDroppedAndTheNextGetsThrough) {
  ControlLimits limits;
  limits.max_frame_bytes = 4096;
  auto rx = bind_limited(limits);
  auto tx = bind_local();
  ASSERT_TRUE(rx && tx);
  EXPECT_EQ(rx->limits().max_frame_bytes, 4096);
  ASSERT_TRUE(tx->send(rx->endpoint(), std::string(4097, 'x')).ok());
  std::optional<std::string> got;
  for (auto end = Clock::now() + 30s; !got && Clock::now() < end;) {
    (void)tx->send(rx->endpoint(), "small");
    got = rx->recv(20ms);
  }
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, "small");  // never the 4097-byte frame
  while (auto more = rx->recv(0ms)) EXPECT_EQ(*more, "small");
}

// Issue 31: at most max_connections outgoing connections; a new destination closes the least
// recently used one (nothing held: its connection is up).
std::optional<std::string> deliver_to(ControlSocket& from, ControlSocket& to, const std::string& frame) {
  EXPECT_TRUE(from.send(to.endpoint(), frame).ok());
  return deliver(from, to);
}

TEST(ControlSocketLimits, ConnectionMapIsCappedLeastRecentlyUsedFirst) {
  ControlLimits limits;
  limits.max_connections = 2;
  auto tx = bind_limited(limits);
  auto a = bind_local(), b = bind_local(), c = bind_local();
  ASSERT_TRUE(tx && a && b && c);
  ASSERT_EQ(deliver_to(*tx, *a, "to a"), "to a");
  ASSERT_EQ(deliver_to(*tx, *b, "to b"), "to b");
  ASSERT_EQ(deliver_to(*tx, *a, "to a again"), "to a again");  // b is now the least recently used
  ASSERT_EQ(deliver_to(*tx, *c, "to c"), "to c");
  EXPECT_EQ(tx->open_connections(), 2u);
  EXPECT_EQ(tx->evicted_connections(), 1u);
  EXPECT_TRUE(tx->connected_to(a->endpoint()));
  EXPECT_FALSE(tx->connected_to(b->endpoint()));
  EXPECT_TRUE(tx->connected_to(c->endpoint()));
}

// wait_connected() brings a connection up before anything is sent on it: a destination that binds
// only after the first-contact window (a busy machine's slow start) is waited for, and what is
// sent then is delivered; a destination nobody binds is refused when the wait ends.
TEST(ControlSocket, WaitConnectedWaitsForALateListenerAndItsFramesArrive) {
  auto a = bind_local();
  ASSERT_TRUE(a);
  std::optional<ReservedPort> reserved;
  reserved.emplace();
  ASSERT_NE(reserved->port, 0);
  const std::string dest = "tcp://127.0.0.1:" + std::to_string(reserved->port);
  std::unique_ptr<ControlSocket> late;
  std::thread binder([&] {
    std::this_thread::sleep_for(1500ms);  // past the 1 s first-contact window
    reserved.reset();  // free the port and start the peer there
    auto b = ControlSocket::bind(dest);
    if (b.ok()) late = std::move(b).value();
  });
  Status st = a->wait_connected(dest, 20s);
  binder.join();
  ASSERT_TRUE(st.ok()) << st.str();
  ASSERT_TRUE(late);
  ASSERT_TRUE(a->send(dest, "first").ok());
  std::optional<std::string> got;
  for (auto end = std::chrono::steady_clock::now() + 20s; !got && std::chrono::steady_clock::now() < end;)
    got = late->recv(100ms);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, "first");
  ReservedPort nobody;
  ASSERT_NE(nobody.port, 0);
  EXPECT_EQ(a->wait_connected("tcp://127.0.0.1:" + std::to_string(nobody.port), 300ms).code(),
            ErrorCode::kPeerUnreachable);
}

}  // namespace
}  // namespace kvferry
