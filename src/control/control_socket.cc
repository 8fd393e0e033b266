// ControlSocket over ZeroMQ (include/kvferry/control.h): one bound PULL socket, PUSH sockets per
// destination created on first send.
//
// PUSH sockets use ZMQ_IMMEDIATE=1: ZeroMQ queues frames only on a completed connection, so a
// send to a dead or never-started peer fails at once (kPeerUnreachable) instead of piling up.
// A new PUSH socket has not finished its TCP connect and handshake yet, so during its first
// kConnectWindow a frame that cannot be queued is held here (at most kMaxHeld frames and
// kMaxHeldBytes) and flushed, in order, by later send()/recv() calls; send() itself waits at most
// kConnectWait, once, for the connection. A frame send() accepted is not dropped once the
// connection has come up: held frames of a connected socket whose queue is full stay held until
// ZeroMQ takes them (later frames get kPeerUnreachable meanwhile, as a full queue does). Only when
// the window ends before any connection did, the held frames are dropped and the peer is
// unreachable. All sockets have ZMQ_LINGER 0: closing never blocks on unsent frames.
//
// Bounds (ControlLimits, docs/security.md): the PULL socket drops a connection whose frame exceeds
// max_frame_bytes (ZMQ_MAXMSGSIZE, before any of it is kept) and queues at most
// receive_high_water_mark frames per incoming connection (ZMQ_RCVHWM); at most max_connections
// PUSH sockets are kept, the least recently used one with nothing held closed for a new one.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "control/curve.h"
#include "kvferry/control.h"
#include "kvferry/messages.h"

namespace kvferry {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kSendHighWaterMark = 10000;
constexpr auto kConnectWait = milliseconds(20);
constexpr auto kConnectWindow = milliseconds(1000);
constexpr size_t kMaxHeld = 1024;
constexpr size_t kMaxHeldBytes = 64u << 20;

using control::context;

ErrorCode code_for(const zmq::error_t& e) {
  switch (e.num()) {
    case EINVAL:
    case EPROTONOSUPPORT:
    case ENOCOMPATPROTO:
      return ErrorCode::kInvalidArgument;
    default:
      return ErrorCode::kInternal;
  }
}

milliseconds until(Clock::time_point t) {
  auto d = std::chrono::ceil<milliseconds>(t - Clock::now());
  return d.count() > 0 ? d : milliseconds(0);
}

struct Push {
  zmq::socket_t socket;
  Clock::time_point created;
  uint64_t used = 0;  // ControlSocket::Impl::uses when last sent to (least recently used: evicted)
  std::deque<std::string> held;  // frames ZeroMQ could not take yet, oldest first
  size_t held_bytes = 0;
  bool connected = false;  // ZeroMQ has taken a frame: the connection came up

  bool in_window() const { return Clock::now() - created < kConnectWindow; }
  bool can_hold(const std::string& frame) const {
    return in_window() && held.size() < kMaxHeld && held_bytes + frame.size() <= kMaxHeldBytes;
  }
  void hold(const std::string& frame) {
    held.push_back(frame);
    held_bytes += frame.size();
  }
  void drop_held() {
    held.clear();
    held_bytes = 0;
  }
  bool try_send(const std::string& frame) {
    const bool sent = socket.send(zmq::buffer(frame), zmq::send_flags::dontwait).has_value();
    connected = connected || sent;
    return sent;
  }
  // Sends held frames in order while ZeroMQ accepts them. A socket that never connected drops
  // them once the window is over. Returns true when nothing is held any more.
  bool flush() {
    while (!held.empty() && try_send(held.front())) {
      held_bytes -= held.front().size();
      held.pop_front();
    }
    if (!held.empty() && !connected && !in_window()) drop_held();
    return held.empty();
  }
};

}  // namespace

struct ControlSocket::Impl {
  const security::ClusterKeys* keys = nullptr;  // CURVE with these; nullptr: none
  zmq::socket_t pull;
  std::string endpoint;        // advertised
  std::string bound_endpoint;  // ZeroMQ's last endpoint of the first bind
  std::unordered_map<std::string, Push> pushes;
  ControlLimits limits;
  uint64_t uses = 0;
  uint64_t evicted = 0;
  // counters(): read from other threads (a manager's stats()).
  std::atomic<uint64_t> frames_sent{0}, bytes_sent{0}, frames_received{0}, bytes_received{0};

  // Room for one more PUSH socket: closes the least recently used one that holds nothing (one
  // holding frames is mid-connect and kept). False: every kept socket holds frames.
  bool make_room() {
    if (pushes.size() < std::max<size_t>(1, limits.max_connections)) return true;
    auto victim = pushes.end();
    for (auto it = pushes.begin(); it != pushes.end(); ++it)
      if (it->second.held.empty() && (victim == pushes.end() || it->second.used < victim->second.used)) victim = it;
    if (victim == pushes.end()) return false;
    pushes.erase(victim);
    ++evicted;
    return true;
  }

  // The PUSH socket to `dest_endpoint`, made (and connecting) if there is none yet.
  Status push_for(const std::string& dest_endpoint, Push*& out);

  void flush_all() {
    for (auto& [dest, p] : pushes) {
      if (!p.held.empty()) p.flush();
    }
  }

  Status queue(const std::string& dest, Push& p, const std::string& frame) {
    if (p.flush()) {
      if (p.try_send(frame)) return Status::Ok();
      const auto wait_until = p.created + kConnectWait;
      if (Clock::now() < wait_until) {
        zmq::pollitem_t item{p.socket.handle(), 0, ZMQ_POLLOUT, 0};
        zmq::poll(&item, 1, until(wait_until));
        if ((item.revents & ZMQ_POLLOUT) && p.try_send(frame)) return Status::Ok();
      }
    }
    if (p.can_hold(frame)) {
      p.hold(frame);
      return Status::Ok();
    }
    if (!p.connected) p.drop_held();
    return Status(ErrorCode::kPeerUnreachable,
                  "control socket: " + dest + " is not connected or its queue is full");
  }
};

ControlSocket::ControlSocket() : impl_(std::make_unique<Impl>()) {}
ControlSocket::~ControlSocket() = default;

namespace {

// The addresses to bind for `host` (ZeroMQ hosts: numeric, or "*" for every interface) and the
// ones among them that need ZMQ_IPV6. A host name is bound on every address it resolves to, so a
// peer reaches it whichever of them its resolver picks.
Result<std::vector<std::string>> bind_hosts(const std::string& host) {
  if (host == "0.0.0.0") return std::vector<std::string>{host};       // every IPv4 interface
  if (is_wildcard_host(host)) return std::vector<std::string>{"*"};  // with ZMQ_IPV6: IPv6 and IPv4
  return resolve_host(host);
}

bool needs_ipv6(const std::string& host) { return host == "*" || is_ipv6_literal(host); }

uint16_t port_of(const std::string& endpoint) {
  auto hp = parse_host_port(endpoint);
  return hp.ok() ? hp->port : 0;
}

constexpr int kBindAttempts = 4;  // a free port of the first address may be taken on another one

}  // namespace

Result<std::unique_ptr<ControlSocket>> ControlSocket::bind(const ListenAddress& address) {
  auto keys = security::cluster_keys();
  if (!keys.ok()) return Status(keys.status().code(), "control socket: " + keys.status().message());
  return bind(address, *keys);
}

Result<std::unique_ptr<ControlSocket>> ControlSocket::bind(const std::string& bind_endpoint) {
  auto keys = security::cluster_keys();
  if (!keys.ok()) return Status(keys.status().code(), "control socket: " + keys.status().message());
  return bind(bind_endpoint, *keys);
}

int64_t ControlLimits::frame_bytes_for_pages(uint64_t num_pages) {
  constexpr int64_t kBase = 4ll << 20;  // registrations, statuses, state and aux indices: far less
  const uint64_t pages = std::min<uint64_t>(num_pages, kMaxKvIndices);
  return kBase + static_cast<int64_t>(8 * pages);
}

Result<std::unique_ptr<ControlSocket>> ControlSocket::bind(const ListenAddress& address,
                                                           const security::ClusterKeys* keys) {
  return bind(address, keys, ControlLimits{});
}

Result<std::unique_ptr<ControlSocket>> ControlSocket::bind(const ListenAddress& address, const ControlLimits& limits) {
  auto keys = security::cluster_keys();
  if (!keys.ok()) return Status(keys.status().code(), "control socket: " + keys.status().message());
  return bind(address, *keys, limits);
}

namespace {
void set_receive_limits(zmq::socket_t& pull, const ControlLimits& limits) {
  pull.set(zmq::sockopt::linger, 0);
  pull.set(zmq::sockopt::maxmsgsize, limits.max_frame_bytes);
  pull.set(zmq::sockopt::rcvhwm, std::max(1, limits.receive_high_water_mark));
}
}  // namespace

Result<std::unique_ptr<ControlSocket>> ControlSocket::bind(const ListenAddress& address,
                                                           const security::ClusterKeys* keys,
                                                           const ControlLimits& limits) {
  auto host = parse_host(address.bind_host);
  if (!host.ok()) return Status(host.status().code(), "control socket: bind host: " + host.status().message());
  if (!address.advertise_host.empty()) {
    auto adv = parse_host(address.advertise_host, /*allow_wildcard=*/false);
    if (!adv.ok()) return Status(adv.status().code(), "control socket: advertise host: " + adv.status().message());
  }
  auto hosts = bind_hosts(*host);
  if (!hosts.ok()) return Status(hosts.status().code(), "control socket: bind host: " + hosts.status().message());
  // IPv4 first, then IPv6: ZMQ_IPV6 applies to the binds after it is set.
  std::stable_partition(hosts->begin(), hosts->end(), [](const std::string& h) { return !needs_ipv6(h); });
  std::string what;
  for (int attempt = 0; attempt < kBindAttempts; ++attempt) {
    std::unique_ptr<ControlSocket> s(new ControlSocket());
    s->impl_->keys = keys;
    s->impl_->limits = limits;
    uint16_t port = address.port;
    try {
      zmq::socket_t pull(context(), zmq::socket_type::pull);
      set_receive_limits(pull, limits);
      if (keys) {
        if (Status st = control::make_curve_server(pull, *keys); !st.ok()) return st;
      }
      for (size_t i = 0; i < hosts->size(); ++i) {
        const std::string& h = (*hosts)[i];
        if (needs_ipv6(h)) pull.set(zmq::sockopt::ipv6, true);
        what = zmq_endpoint(h, port);
        pull.bind(what);
        const std::string bound = pull.get(zmq::sockopt::last_endpoint);
        if (i == 0) {
          s->impl_->bound_endpoint = bound;
          port = port_of(bound);
        }
      }
      if (port == 0) return Status(ErrorCode::kInternal, "control socket: no port bound for " + what);
      s->impl_->endpoint = zmq_endpoint(address.advertised(), port);
      s->impl_->pull = std::move(pull);
      return s;
    } catch (const zmq::error_t& e) {
      // Only a port another address had free but this one has not is worth a retry.
      if (e.num() == EADDRINUSE && address.port == 0 && port != 0 && attempt + 1 < kBindAttempts) continue;
      return Status(code_for(e), "control socket: cannot bind " + what + ": " + e.what());
    }
  }
  return Status(ErrorCode::kInternal, "control socket: cannot bind " + what);
}

Result<std::unique_ptr<ControlSocket>> ControlSocket::bind(const std::string& bind_endpoint,
                                                           const security::ClusterKeys* keys) {
  if (bind_endpoint.rfind("tcp://", 0) == 0) {
    auto address = listen_address_for(bind_endpoint);
    if (!address.ok()) return Status(address.status().code(), "control socket: " + address.status().message());
    return bind(*address, keys);
  }
  std::unique_ptr<ControlSocket> s(new ControlSocket());
  s->impl_->keys = keys;
  try {
    zmq::socket_t pull(context(), zmq::socket_type::pull);
    set_receive_limits(pull, s->impl_->limits);
    if (keys) {
      if (Status st = control::make_curve_server(pull, *keys); !st.ok()) return st;
    }
    pull.bind(bind_endpoint);
    s->impl_->endpoint = pull.get(zmq::sockopt::last_endpoint);
    s->impl_->bound_endpoint = s->impl_->endpoint;
    s->impl_->pull = std::move(pull);
  } catch (const zmq::error_t& e) {
    return Status(code_for(e), "control socket: cannot bind " + bind_endpoint + ": " + e.what());
  }
  return s;
}

const std::string& ControlSocket::endpoint() const { return impl_->endpoint; }
const std::string& ControlSocket::bound_endpoint() const { return impl_->bound_endpoint; }

Status ControlSocket::send(const std::string& dest_endpoint, const std::string& frame) {
  Push* p = nullptr;
  if (Status st = impl_->push_for(dest_endpoint, p); !st.ok()) return st;
  p->used = ++impl_->uses;
  try {
    Status st = impl_->queue(dest_endpoint, *p, frame);
    if (st.ok()) {
      impl_->frames_sent.fetch_add(1, std::memory_order_relaxed);
      impl_->bytes_sent.fetch_add(frame.size(), std::memory_order_relaxed);
    }
    return st;
  } catch (const zmq::error_t& e) {
    return Status(ErrorCode::kPeerUnreachable,
                  "control socket: send to " + dest_endpoint + " failed: " + e.what());
  }
}

Status ControlSocket::wait_connected(const std::string& dest_endpoint, milliseconds timeout) {
  Push* p = nullptr;
  if (Status st = impl_->push_for(dest_endpoint, p); !st.ok()) return st;
  p->used = ++impl_->uses;
  const auto deadline = Clock::now() + timeout;
  try {
    while (!p->connected) {
      // ZMQ_IMMEDIATE: the socket is writable only once a connection is up.
      zmq::pollitem_t item{p->socket.handle(), 0, ZMQ_POLLOUT, 0};
      zmq::poll(&item, 1, std::min(milliseconds(50), std::max(milliseconds(0), until(deadline))));
      if (item.revents & ZMQ_POLLOUT) p->connected = true;  // held frames are kept from now on
      else if (Clock::now() >= deadline)
        return Status(ErrorCode::kPeerUnreachable, "control socket: no connection to " + dest_endpoint + " within " +
                                                       std::to_string(timeout.count()) + " ms");
    }
    p->flush();
  } catch (const zmq::error_t& e) {
    return Status(ErrorCode::kPeerUnreachable, "control socket: connect to " + dest_endpoint + " failed: " + e.what());
  }
  return Status::Ok();
}

Status ControlSocket::Impl::push_for(const std::string& dest_endpoint, Push*& out) {
  auto it = pushes.find(dest_endpoint);
  if (it == pushes.end()) {
    if (!make_room())
      return Status(ErrorCode::kResourceExhausted,
                    "control socket: " + std::to_string(pushes.size()) +
                        " connections, each still connecting: no room for " + dest_endpoint);
    try {
      zmq::socket_t push(context(), zmq::socket_type::push);
      push.set(zmq::sockopt::linger, 0);
      push.set(zmq::sockopt::sndhwm, kSendHighWaterMark);
      push.set(zmq::sockopt::immediate, true);
      if (keys) control::make_curve_client(push, *keys);
      // IPv6 literals and host names (which may resolve to IPv6) need ZMQ_IPV6 to be reached.
      auto dest = parse_host_port(dest_endpoint);
      push.set(zmq::sockopt::ipv6, !dest.ok() || !is_ipv4_literal(dest->host));
      push.connect(dest_endpoint);
      it = pushes.emplace(dest_endpoint, Push{std::move(push), Clock::now(), 0, {}, 0, false}).first;
    } catch (const zmq::error_t& e) {
      return Status(code_for(e),
                    "control socket: cannot connect to " + dest_endpoint + ": " + e.what());
    }
  }
  out = &it->second;
  return Status::Ok();
}

std::optional<std::string> ControlSocket::recv(milliseconds timeout) {
  try {
    const auto deadline = Clock::now() + timeout;
    zmq::message_t msg;
    std::vector<zmq::pollitem_t> items;
    for (;;) {
      impl_->flush_all();
      if (impl_->pull.recv(msg, zmq::recv_flags::dontwait)) break;
      const milliseconds left = until(deadline);
      if (left.count() == 0) return std::nullopt;
      // Wait for a frame, or for a held frame's connection to come up (then flush and go on).
      items.assign(1, zmq::pollitem_t{impl_->pull.handle(), 0, ZMQ_POLLIN, 0});
      for (auto& [dest, p] : impl_->pushes) {
        if (!p.held.empty()) items.push_back({p.socket.handle(), 0, ZMQ_POLLOUT, 0});
      }
      zmq::poll(items, left);
    }
    std::string frame = msg.to_string();
    impl_->frames_received.fetch_add(1, std::memory_order_relaxed);
    impl_->bytes_received.fetch_add(frame.size(), std::memory_order_relaxed);
    // Frames are single-part; drop any further parts so they cannot pose as frames.
    while (msg.more()) {
      if (!impl_->pull.recv(msg, zmq::recv_flags::dontwait)) break;
    }
    return frame;
  } catch (const zmq::error_t&) {
    return std::nullopt;  // EINTR and the like: nothing received this time
  }
}

void ControlSocket::forget(const std::string& dest_endpoint) {
  impl_->pushes.erase(dest_endpoint);
}

int ControlSocket::fd() const {
  try {
    return static_cast<int>(impl_->pull.get(zmq::sockopt::fd));
  } catch (const zmq::error_t&) {
    return -1;
  }
}

void ControlSocket::linger(std::chrono::milliseconds time) {
  impl_->flush_all();
  for (auto& [dest, p] : impl_->pushes) p.socket.set(zmq::sockopt::linger, static_cast<int>(time.count()));
}

size_t ControlSocket::open_connections() const { return impl_->pushes.size(); }
bool ControlSocket::connected_to(const std::string& dest_endpoint) const {
  return impl_->pushes.count(dest_endpoint) != 0;
}
uint64_t ControlSocket::evicted_connections() const { return impl_->evicted; }
ControlSocket::Counters ControlSocket::counters() const {
  Counters c;
  c.frames_sent = impl_->frames_sent.load(std::memory_order_relaxed);
  c.bytes_sent = impl_->bytes_sent.load(std::memory_order_relaxed);
  c.frames_received = impl_->frames_received.load(std::memory_order_relaxed);
  c.bytes_received = impl_->bytes_received.load(std::memory_order_relaxed);
  return c;
}
const ControlLimits& ControlSocket::limits() const { return impl_->limits; }

}  // namespace kvferry
