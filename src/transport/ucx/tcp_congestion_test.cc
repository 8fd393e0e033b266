// The congestion control of UCX's tcp sockets (tcp_congestion.h): which sockets are switched,
// which are left alone, what a refusal gives; then through two real UCX tcp transports.
#include "transport/ucx/tcp_congestion.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>

#include "transport/ucx/transport_test_util.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {
namespace {

std::string host_default() {
  std::ifstream f("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string s;
  f >> s;
  return s;
}

// An algorithm every kernel has (reno is built in and always allowed) that differs from the
// host's default, so a switch is visible.
std::string other_algorithm() { return host_default() == "reno" ? "cubic" : "reno"; }

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// A listener on 127.0.0.1 (any port); its address in *addr.
int listen_loopback(sockaddr_in* addr) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 4) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  *addr = a;
  return fd;
}

int connect_to(const sockaddr_in& a) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  return connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 ? fd : -1;
}

// Bytes that name `a` the way a UCX worker address does: its IPv4 address and port, raw, among
// other bytes.
std::string blob_naming(const sockaddr_in& a) {
  std::string b = "\x11\x22hdr";
  b.append(reinterpret_cast<const char*>(&a.sin_addr), sizeof a.sin_addr);
  b += "\x7f-mid-";
  b.append(reinterpret_cast<const char*>(&a.sin_port), sizeof a.sin_port);
  return b + "tail";
}

TEST(TcpCongestion, ListenerAcceptedAndConnectedSocketsNamedByTheAddressesAreSwitched) {
  const std::string algo = other_algorithm();
  sockaddr_in ucx_addr{}, other_addr{};
  Fd listener(listen_loopback(&ucx_addr));
  Fd other_listener(listen_loopback(&other_addr));
  ASSERT_GE(listener.fd, 0);
  ASSERT_GE(other_listener.fd, 0);
  Fd client(connect_to(ucx_addr));
  ASSERT_GE(client.fd, 0);
  Fd accepted(accept(listener.fd, nullptr, nullptr));
  ASSERT_GE(accepted.fd, 0);
  Fd other_client(connect_to(other_addr));
  ASSERT_GE(other_client.fd, 0);
  Fd other_accepted(accept(other_listener.fd, nullptr, nullptr));
  const std::string before = socket_congestion(other_client.fd);
  ASSERT_NE(before, "");

  // Own address: the listener and what it accepted; the peer's: the socket connected to it.
  const CongestionOutcome r = set_ucx_congestion(algo, blob_naming(ucx_addr), blob_naming(ucx_addr));
  EXPECT_EQ(r.failed, 0u) << r.error;
  EXPECT_EQ(r.tuned, 3u);
  EXPECT_EQ(socket_congestion(listener.fd), algo);
  EXPECT_EQ(socket_congestion(accepted.fd), algo);
  EXPECT_EQ(socket_congestion(client.fd), algo);
  // Sockets the addresses do not name keep the host's choice.
  EXPECT_EQ(socket_congestion(other_listener.fd), before);
  EXPECT_EQ(socket_congestion(other_client.fd), before);
  EXPECT_EQ(socket_congestion(other_accepted.fd), before);

  // A second pass finds them switched already.
  const CongestionOutcome again = set_ucx_congestion(algo, blob_naming(ucx_addr), blob_naming(ucx_addr));
  EXPECT_EQ(again.tuned, 0u);
  EXPECT_EQ(again.already, 3u);
}

// An IPv4 or IPv6 socket address (the family from the text).
sockaddr_storage at(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  auto& a4 = reinterpret_cast<sockaddr_in&>(ss);
  auto& a6 = reinterpret_cast<sockaddr_in6&>(ss);
  if (inet_pton(AF_INET, ip, &a4.sin_addr) == 1) {
    a4.sin_family = AF_INET;
    a4.sin_port = htons(port);
  } else if (inet_pton(AF_INET6, ip, &a6.sin6_addr) == 1) {
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons(port);
  }
  return ss;
}

// The raw bytes of an address and a port, as UCX packs them, between other bytes.
std::string blob_of(const sockaddr_storage& ss, bool with_addr, bool with_port) {
  std::string b = "hdr";
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
    if (with_addr) b.append(reinterpret_cast<const char*>(&a.sin_addr), 4);
    b += "--";
    if (with_port) b.append(reinterpret_cast<const char*>(&a.sin_port), 2);
  } else {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    if (with_addr) b.append(reinterpret_cast<const char*>(&a.sin6_addr), 16);
    b += "--";
    if (with_port) b.append(reinterpret_cast<const char*>(&a.sin6_port), 2);
  }
  return b + "tail";
}

TEST(TcpCongestion, AnAddressIsNamedByItsAddressAndPortBytesTogether) {
  for (const sockaddr_storage& ss : {at("10.1.2.3", 40001), at("2001:db8::7", 40001)}) {
    EXPECT_TRUE(names_socket_address(ss, blob_of(ss, true, true)));
    EXPECT_FALSE(names_socket_address(ss, blob_of(ss, true, false)));
    EXPECT_FALSE(names_socket_address(ss, blob_of(ss, false, true)));
    EXPECT_FALSE(names_socket_address(ss, ""));
  }
  // A loopback interface is named by the port (UCX does not pack 127.0.0.1 or ::1).
  for (const sockaddr_storage& ss : {at("127.0.0.1", 40001), at("127.1.2.3", 40001), at("::1", 40001)}) {
    EXPECT_TRUE(names_socket_address(ss, blob_of(ss, false, true)));
    EXPECT_FALSE(names_socket_address(ss, blob_of(ss, true, false)));
  }
  // Wildcards and port 0 never match, whatever the bytes.
  EXPECT_FALSE(names_socket_address(at("0.0.0.0", 40001), blob_of(at("0.0.0.0", 40001), true, true)));
  EXPECT_FALSE(names_socket_address(at("10.1.2.3", 0), blob_of(at("10.1.2.3", 0), true, true)));
  EXPECT_FALSE(names_socket_address(at("::", 40001), blob_of(at("::", 40001), true, true)));
}

TEST(TcpCongestion, ALoopbackSocketWhosePortIsNotNamedIsLeftAlone) {
  sockaddr_in ucx_addr{};
  Fd listener(listen_loopback(&ucx_addr));
  ASSERT_GE(listener.fd, 0);
  const std::string before = socket_congestion(listener.fd);
  std::string only_addr(reinterpret_cast<const char*>(&ucx_addr.sin_addr), 4);
  for (const std::string& blob : {only_addr, std::string()}) {
    const CongestionOutcome r = set_ucx_congestion(other_algorithm(), blob, blob);
    EXPECT_EQ(r.tuned + r.already + r.failed, 0u);
  }
  EXPECT_EQ(socket_congestion(listener.fd), before);
}

TEST(TcpCongestion, AnAlgorithmTheKernelRefusesIsCountedAndNamed) {
  sockaddr_in ucx_addr{};
  Fd listener(listen_loopback(&ucx_addr));
  ASSERT_GE(listener.fd, 0);
  const std::string before = socket_congestion(listener.fd);
  const CongestionOutcome r = set_ucx_congestion("kvf_no_such", blob_naming(ucx_addr), {});
  EXPECT_EQ(r.tuned, 0u);
  EXPECT_EQ(r.failed, 1u);
  EXPECT_NE(r.error.find("\"kvf_no_such\""), std::string::npos) << r.error;
  EXPECT_EQ(socket_congestion(listener.fd), before);
}

// Every TCP socket of this process and its algorithm.
std::multiset<std::string> process_algorithms() {
  std::multiset<std::string> out;
  DIR* d = opendir("/proc/self/fd");
  while (const dirent* e = d ? readdir(d) : nullptr) {
    const std::string a = socket_congestion(std::atoi(e->d_name));
    if (!a.empty()) out.insert(a);
  }
  if (d) closedir(d);
  return out;
}

TEST(TcpCongestion, UcxTcpTransportSwitchesItsOwnSocketsAndMovesData) {
  for (const std::string& algo : {other_algorithm(), std::string()}) {
    const auto others_before = process_algorithms().count(other_algorithm());
    TransportOptions opt;
    opt.kind = TransportKind::kTcp;
    opt.tcp_congestion = algo;
    struct {
      std::unique_ptr<UcxTransport> a, b;
      LocalRegion ra, rb;
      PeerId peer = 0;
    } p;
    p.a = std::move(UcxTransport::create(opt).value());
    p.b = std::move(UcxTransport::create(opt).value());
    testing::wire_pair(p, 1 << 20, 0xEE);
    ASSERT_NE(p.peer, 0u);
    const std::vector<WriteOp> ops = {{0, 4096, 256 << 10}};
    ASSERT_TRUE(testing::write_and_wait(*p.a, p.peer, 1, ops).ok()) << algo;
    EXPECT_EQ(std::memcmp(p.rb.base + 4096, p.ra.base, 256 << 10), 0) << algo;
    const TransportStats sa = p.a->stats(), sb = p.b->stats();
    EXPECT_EQ(sa.tcp_congestion_failures + sb.tcp_congestion_failures, 0u) << algo;
    if (algo.empty()) {
      // The host's default everywhere: nothing switched.
      EXPECT_EQ(sa.tcp_sockets_tuned + sb.tcp_sockets_tuned, 0u);
      EXPECT_EQ(process_algorithms().count(other_algorithm()), others_before);
    } else {
      // Each side's listeners; A's socket to B (the one that carries A's writes); B's accepted.
      EXPECT_GE(sa.tcp_sockets_tuned, 2u);
      EXPECT_GE(sb.tcp_sockets_tuned, 1u);
      EXPECT_GE(process_algorithms().count(algo), others_before + 3);
    }
  }
}

}  // namespace
}  // namespace kvferry::ucx
