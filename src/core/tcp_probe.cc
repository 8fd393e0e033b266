// A TCP connect to a "tcp://HOST:PORT" endpoint, to tell a live process from a gone one
// (core/tcp_probe.h). Used by the peer monitor and the bootstrap service.
#include "core/tcp_probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "kvferry/error.h"
#include "kvferry/net.h"

namespace kvferry {
namespace {

// A non-blocking TCP connect to `addr`, waiting at most `timeout_ms` for it to complete.
TcpProbe connects(const addrinfo& addr, int timeout_ms) {
  using Probe = TcpProbe;
  const int fd = ::socket(addr.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Probe::kRefused;  // this host cannot probe: no evidence either way
  int err = ::connect(fd, addr.ai_addr, addr.ai_addrlen) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, timeout_ms) == 1) {
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    } else {
      err = ETIMEDOUT;  // no SYN-ACK and no RST within the budget
    }
  }
  ::close(fd);
  switch (err) {
    case 0: return Probe::kAccepts;
    case ETIMEDOUT: case ENETUNREACH: case EHOSTUNREACH: case ENETDOWN: case EHOSTDOWN: return Probe::kUnanswered;
    default: return Probe::kRefused;
  }
}

}  // namespace

TcpProbe probe_tcp_endpoint(const std::string& endpoint, int timeout_ms) {
  using Probe = TcpProbe;
  if (endpoint.rfind("tcp://", 0) != 0) return Probe::kRefused;
  auto hp = parse_host_port(endpoint);
  if (!hp.ok() || hp->port == 0 || is_wildcard_host(hp->host)) return Probe::kRefused;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;  // a host name may resolve to IPv4, IPv6 or both
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(hp->port);
  if (::getaddrinfo(hp->host.c_str(), port.c_str(), &hints, &res) != 0) return Probe::kRefused;
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  // Every address in the resolver's order, within one overall budget: any that accepts is enough;
  // any left unanswered (or untried for want of time) leaves the answer open.
  const int64_t deadline = monotonic_ns() + static_cast<int64_t>(timeout_ms) * 1'000'000;
  size_t tried = 0;
  Probe answer = Probe::kRefused;
  for (const addrinfo* ai = res; ai != nullptr && tried < kMaxResolvedAddresses; ai = ai->ai_next, ++tried) {
    const int64_t left_ms = (deadline - monotonic_ns()) / 1'000'000;
    if (left_ms <= 0) return Probe::kUnanswered;
    const Probe p = connects(*ai, static_cast<int>(left_ms));
    if (p == Probe::kAccepts) return p;
    if (p == Probe::kUnanswered) answer = p;
  }
  return answer;
}


}  // namespace kvferry
