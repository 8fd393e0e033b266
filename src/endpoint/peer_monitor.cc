#include "endpoint/peer_monitor.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <memory>

#include "kvferry/control.h"
#include "kvferry/messages.h"
#include "kvferry/net.h"

namespace kvferry {

PeerMonitor::PeerMonitor(RankId self, const Deadlines& deadlines, ListenAddress heartbeat, uint64_t incarnation)
    : self_(self), incarnation_(incarnation != 0 ? incarnation : 1), deadlines_(deadlines), heartbeat_(std::move(heartbeat)), thread_([this] { run(); }) {}

PeerMonitor::~PeerMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PeerMonitor::watch(const RankId& peer, const std::string& control_endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_[peer] = {control_endpoint, monotonic_ns(), false};
}

void PeerMonitor::unwatch(const RankId& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_.erase(peer);
}

void PeerMonitor::heard(const RankId& peer, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  it->second.last_heard_ns = now_ns;
  it->second.probed_ns = 0;
  if (it->second.reported) {
    it->second.reported = false;
    it->second.revived = true;
  }
}

void PeerMonitor::mark_dead(const RankId& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it != peers_.end()) it->second.reported = true;
}

std::vector<RankId> PeerMonitor::take_revived() {
  std::vector<RankId> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [rank, p] : peers_) {
    if (p.revived) {
      p.revived = false;
      out.push_back(rank);
    }
  }
  return out;
}

std::vector<DeadPeer> PeerMonitor::take_dead(int64_t now_ns) {
  std::vector<DeadPeer> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [rank, p] : peers_) {
    int64_t silent = now_ns - p.last_heard_ns;
    const int64_t timeout_ns = deadlines_.heartbeat_timeout_ms * 1'000'000;
    if (p.reported || silent <= timeout_ns) continue;
    if (silent <= kHungFactor * timeout_ns) {
      // Suspected: confirmed unless the peer's endpoint still accepts connections.
      const int64_t real_now = monotonic_ns();
      if (p.probed_ns == 0 || real_now - p.probed_ns >= kProbeIntervalMs * 1'000'000) {
        p.probe_alive = endpoint_accepts(p.endpoint, 20);
        p.probed_ns = real_now;
      }
      if (p.probe_alive) continue;
    }
    p.reported = true;
    out.push_back({rank, silent / 1'000'000});
  }
  return out;
}

namespace {

// A non-blocking TCP connect to `addr`, waiting at most `timeout_ms` for it to complete.
bool connects(const addrinfo& addr, int timeout_ms) {
  const int fd = ::socket(addr.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool ok = ::connect(fd, addr.ai_addr, addr.ai_addrlen) == 0;
  if (!ok && errno == EINPROGRESS) {
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, timeout_ms) == 1) {
      int err = 0;
      socklen_t len = sizeof err;
      ok = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

bool PeerMonitor::endpoint_accepts(const std::string& endpoint, int timeout_ms) {
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  auto hp = parse_host_port(endpoint);
  if (!hp.ok() || hp->port == 0 || is_wildcard_host(hp->host)) return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;  // a host name may resolve to IPv4, IPv6 or both
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(hp->port);
  if (::getaddrinfo(hp->host.c_str(), port.c_str(), &hints, &res) != 0) return false;
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  // Every address in the resolver's order, within one overall budget: any that accepts is enough.
  const int64_t deadline = monotonic_ns() + static_cast<int64_t>(timeout_ms) * 1'000'000;
  size_t tried = 0;
  for (const addrinfo* ai = res; ai != nullptr && tried < kMaxResolvedAddresses; ai = ai->ai_next, ++tried) {
    const int64_t left_ms = (deadline - monotonic_ns()) / 1'000'000;
    if (left_ms <= 0) break;
    if (connects(*ai, static_cast<int>(left_ms))) return true;
  }
  return false;
}

size_t PeerMonitor::watched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peers_.size();
}

void PeerMonitor::run() {
  ListenAddress address = heartbeat_;
  address.port = 0;
  auto sock = ControlSocket::bind(address);
  if (!sock.ok()) return;  // no heartbeats: peers will time us out, which is the honest outcome
  uint64_t seq = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    std::vector<std::string> endpoints;
    for (auto& [rank, p] : peers_) endpoints.push_back(p.endpoint);
    lock.unlock();
    Heartbeat hb{self_, ++seq, monotonic_ns(), incarnation_};
    std::string frame = encode(hb);
    for (const std::string& ep : endpoints) (void)(*sock)->send(ep, frame);
    (void)(*sock)->recv(std::chrono::milliseconds(0));  // lets held frames go out
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(deadlines_.heartbeat_interval_ms), [&] { return stop_; });
  }
}

}  // namespace kvferry
