// connect_reverse (kvferry/transport.h): the receiver opens the connection, the writer's connect
// reuses it, so the writer sends over a socket its own listener accepted (docs/transport.md "TCP
// congestion control").
#include <gtest/gtest.h>

#include <dirent.h>
#include <netinet/in.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_acked (glibc's has not)
#include <sys/socket.h>

#include <cstring>
#include <set>
#include <string>

#include "transport/ucx/tcp_congestion.h"
#include "transport/ucx/transport_test_util.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {
namespace {

struct SocketView {
  uint16_t local_port = 0;
  bool listening = false;
  uint64_t bytes_acked = 0;  // sent by this socket and acknowledged
};

uint16_t port_of(const sockaddr_storage& ss) {
  return ntohs(ss.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in&>(ss).sin_port
                                       : reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
}

// Every TCP socket of this process.
std::vector<SocketView> tcp_sockets() {
  std::vector<SocketView> out;
  DIR* d = opendir("/proc/self/fd");
  while (const dirent* e = d ? readdir(d) : nullptr) {
    const int fd = std::atoi(e->d_name);
    if (socket_congestion(fd).empty()) continue;  // not a TCP socket
    SocketView v;
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    v.local_port = port_of(ss);
    int listening = 0;
    len = sizeof listening;
    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len);
    v.listening = listening != 0;
    tcp_info info{};
    len = sizeof info;
    if (!v.listening && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0) v.bytes_acked = info.tcpi_bytes_acked;
    out.push_back(v);
  }
  if (d) closedir(d);
  return out;
}

struct Pair {
  std::unique_ptr<UcxTransport> a, b;  // a writes into b
  LocalRegion ra, rb;
  PeerId peer = 0;
};

std::unique_ptr<UcxTransport> make(TransportKind kind) {
  TransportOptions opt;
  opt.kind = kind;
  auto t = UcxTransport::create(opt);
  EXPECT_TRUE(t.ok()) << t.status().str();
  return t.ok() ? std::move(t).value() : nullptr;
}

constexpr uint64_t kRegion = 4 << 20;
constexpr uint64_t kWrite = 3 << 20;

// For each socket that sent a whole write (kWrite bytes acknowledged): whether a listener of this
// process accepted it (its local port is a listening port) rather than it connecting itself.
std::vector<bool> carriers_accepted() {
  std::set<uint16_t> listening;
  const std::vector<SocketView> sockets = tcp_sockets();
  for (const SocketView& v : sockets)
    if (v.listening) listening.insert(v.local_port);
  std::vector<bool> out;
  for (const SocketView& v : sockets)
    if (!v.listening && v.bytes_acked >= kWrite) out.push_back(listening.count(v.local_port) > 0);
  return out;
}

TEST(ReverseConnect, TheWriterSendsOverTheConnectionTheReceiverOpened) {
  Pair p;
  p.a = make(TransportKind::kTcp);
  p.b = make(TransportKind::kTcp);
  ASSERT_TRUE(p.a && p.b);
  // B (the receiver) opens the connection before A connects: A's connect reuses it.
  ASSERT_TRUE(p.b->connect_reverse(p.a->address()).ok());
  ASSERT_TRUE(p.b->connect_reverse(p.a->address()).ok());  // one per address: nothing new
  EXPECT_EQ(p.b->stats().peers, 0u);                       // not a peer anyone writes to
  testing::wire_pair(p, kRegion, 0xEE);
  ASSERT_NE(p.peer, 0u);
  ASSERT_TRUE(testing::write_and_wait(*p.a, p.peer, 7, {{0, 0, kWrite}}).ok());
  EXPECT_EQ(std::memcmp(p.ra.base, p.rb.base, kWrite), 0);

  // The socket that carried the write is one a listener of this process accepted (its local port
  // is a listening port): A's, since B connected to A.
  const std::vector<bool> accepted = carriers_accepted();
  EXPECT_EQ(accepted, std::vector<bool>{true}) << "the write went out on a socket A connected itself";
}

TEST(ReverseConnect, WithoutItTheWriterSendsOverTheSocketItConnected) {
  // The control case: the assertion above tells the two apart.
  Pair p;
  p.a = make(TransportKind::kTcp);
  p.b = make(TransportKind::kTcp);
  ASSERT_TRUE(p.a && p.b);
  testing::wire_pair(p, kRegion, 0xEE);
  ASSERT_NE(p.peer, 0u);
  ASSERT_TRUE(testing::write_and_wait(*p.a, p.peer, 7, {{0, 0, kWrite}}).ok());
  EXPECT_EQ(carriers_accepted(), std::vector<bool>{false});
}

TEST(ReverseConnect, BadAddressesAreRefusedAndShmIgnoresIt) {
  auto b = make(TransportKind::kTcp);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->connect_reverse("").code(), ErrorCode::kProtocolError);
  std::string wrong_version = b->address();
  wrong_version[0] = static_cast<char>((wrong_version[0] & 0xf0) | ((wrong_version[0] + 1) & 0x0f));
  EXPECT_EQ(b->connect_reverse(wrong_version).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(b->connect_reverse(std::string(kMaxWorkerAddressBytes + 1, 'x')).code(), ErrorCode::kProtocolError);
  auto shm_a = make(TransportKind::kShm);
  auto shm_b = make(TransportKind::kShm);
  ASSERT_TRUE(shm_a && shm_b);
  EXPECT_TRUE(shm_b->connect_reverse(shm_a->address()).ok());  // nothing to do over shm
  EXPECT_EQ(shm_b->stats().peers, 0u);
}

TEST(ReverseConnect, TheWriterGoingAwayClosesItQuietlyAndANewOneCanFollow) {
  auto b = make(TransportKind::kTcp);
  ASSERT_TRUE(b);
  auto rb = b->create_region(kRegion);
  ASSERT_TRUE(rb.ok());
  for (int round = 0; round < 2; ++round) {
    auto a = make(TransportKind::kTcp);
    ASSERT_TRUE(a);
    auto ra = a->create_region(kRegion);
    ASSERT_TRUE(ra.ok());
    ASSERT_TRUE(b->connect_reverse(a->address()).ok()) << round;
    auto id = a->connect(testing::remote_info(*b, *rb));
    ASSERT_TRUE(id.ok()) << id.status().str();
    std::memset(ra->base, 0x30 + round, kWrite);
    ASSERT_TRUE(testing::write_and_wait(*a, *id, 1, {{0, 0, kWrite}}).ok()) << round;
    EXPECT_EQ(rb->base[kWrite - 1], 0x30 + round);
    a.reset();  // the writer's process goes away: B's reverse endpoint fails and is closed
  }
  EXPECT_EQ(b->stats().peers, 0u);
}

}  // namespace
}  // namespace kvferry::ucx
