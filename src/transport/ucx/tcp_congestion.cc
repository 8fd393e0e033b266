// docs/transport.md "TCP congestion control".
#include "transport/ucx/tcp_congestion.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace kvferry::ucx {
namespace {

// The kernel's limit on a congestion control name, with its NUL (kCaNameMax in
// include/net/tcp.h; not in the user-space headers).
constexpr size_t kCaNameMax = 16;

// The raw address and port bytes of a socket address, or false for a wildcard, a zero port or
// another family.
bool address_bytes(const sockaddr_storage& ss, std::string* addr, std::string* port) {
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY) || a.sin_port == 0) return false;
    addr->assign(reinterpret_cast<const char*>(&a.sin_addr), sizeof a.sin_addr);
    port->assign(reinterpret_cast<const char*>(&a.sin_port), sizeof a.sin_port);
    return true;
  }
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) || a.sin6_port == 0) return false;
    addr->assign(reinterpret_cast<const char*>(&a.sin6_addr), sizeof a.sin6_addr);
    port->assign(reinterpret_cast<const char*>(&a.sin6_port), sizeof a.sin6_port);
    return true;
  }
  return false;
}

bool is_loopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr) >> 24) == 127;
  return ss.ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr);
}

}  // namespace

bool names_socket_address(const sockaddr_storage& ss, std::string_view blob) {
  std::string addr, port;
  if (blob.empty() || !address_bytes(ss, &addr, &port)) return false;
  if (blob.find(port) == std::string_view::npos) return false;
  return is_loopback(ss) || blob.find(addr) != std::string_view::npos;
}

namespace {

bool named_in(const sockaddr_storage& ss, std::string_view blob) { return names_socket_address(ss, blob); }

bool is_tcp_stream(int fd) {
  int v = 0;
  socklen_t len = sizeof v;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) != 0 || v != SOCK_STREAM) return false;
  len = sizeof v;
  if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &len) != 0 || v != IPPROTO_TCP) return false;
  len = sizeof v;
  return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len) == 0 && (v == AF_INET || v == AF_INET6);
}

bool is_ucx_socket(int fd, std::string_view own, std::string_view peer) {
  sockaddr_storage local{}, remote{};
  socklen_t len = sizeof local;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return false;
  int listening = 0;
  len = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0) return false;
  if (listening != 0) return named_in(local, own);
  len = sizeof remote;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &len) != 0) return false;  // not connected
  return named_in(local, own) || named_in(remote, peer);
}

// This process's descriptors (a snapshot of /proc/self/fd).
std::vector<int> open_descriptors() {
  std::vector<int> fds;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return fds;
  const int own = dirfd(d);
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd < 0 || fd == own) continue;
    fds.push_back(static_cast<int>(fd));
  }
  closedir(d);
  return fds;
}

}  // namespace

std::string socket_congestion(int fd) {
  char name[kCaNameMax] = {};
  socklen_t len = sizeof name;
  if (!is_tcp_stream(fd) || getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, sizeof name));
}

CongestionOutcome set_ucx_congestion(const std::string& algo, std::string_view own_address,
                                     std::string_view peer_address) {
  CongestionOutcome out;
  if (algo.empty() || algo.size() >= kCaNameMax) return out;
  for (int fd : open_descriptors()) {
    if (!is_tcp_stream(fd) || !is_ucx_socket(fd, own_address, peer_address)) continue;
    if (socket_congestion(fd) == algo) {
      out.already++;
      continue;
    }
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algo.data(), static_cast<socklen_t>(algo.size())) == 0) {
      out.tuned++;
      continue;
    }
    const int err = errno;
    if (err == EBADF || err == ENOTSOCK) continue;  // closed by its owner meanwhile
    if (out.failed++ == 0)
      out.error = "setsockopt(TCP_CONGESTION, \"" + algo + "\"): " + std::strerror(err);
  }
  return out;
}

}  // namespace kvferry::ucx
