#include <gtest/gtest.h>

#include <chrono>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <thread>
#include <vector>

#include "kvferry/control.h"

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
std::optional<std::string> deliver(ControlSocket& from, ControlSocket& to) {
  for (int i = 0; i < 200; ++i) {
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

}  // namespace
}  // namespace kvferry
