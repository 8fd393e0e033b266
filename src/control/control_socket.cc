// ControlSocket over ZeroMQ (include/kvferry/control.h): one bound PULL socket, PUSH sockets per
// destination created on first send.
//
// PUSH sockets use ZMQ_IMMEDIATE=1: ZeroMQ queues frames only on a completed connection, so a
// send to a dead or never-started peer fails at once (kPeerUnreachable) instead of piling up.
// A new PUSH socket has not finished its TCP connect and handshake yet, so during its first
// kConnectWindow a frame that cannot be queued is held here (at most kMaxHeld frames) and flushed,
// in order, by later send()/recv() calls; send() itself waits at most kConnectWait, once, for the
// connection. When the window ends with frames still held, they are dropped and the peer is
// unreachable. All sockets have ZMQ_LINGER 0: closing never blocks on unsent frames.
#include <chrono>
#include <deque>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

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
// The largest frame decode() can accept, plus slack: bigger frames drop the sending connection.
constexpr int64_t kMaxFrameBytes = 8ll * kMaxKvIndices + (1ll << 20);

// One context per process, never destroyed: destroying it at exit would block on any socket a
// caller leaked (zmq_ctx_term waits for every socket to close).
zmq::context_t& context() {
  static zmq::context_t* ctx = new zmq::context_t(1);
  return *ctx;
}

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
  std::deque<std::string> held;  // frames waiting for the first connection, oldest first

  bool in_window() const { return Clock::now() - created < kConnectWindow; }
  bool try_send(const std::string& frame) {
    return socket.send(zmq::buffer(frame), zmq::send_flags::dontwait).has_value();
  }
  // Sends held frames in order while ZeroMQ accepts them; drops them once the window is over.
  // Returns true when nothing is held any more.
  bool flush() {
    while (!held.empty() && try_send(held.front())) held.pop_front();
    if (!held.empty() && !in_window()) held.clear();
    return held.empty();
  }
};

}  // namespace

struct ControlSocket::Impl {
  zmq::socket_t pull;
  std::string endpoint;
  std::unordered_map<std::string, Push> pushes;

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
    if (p.in_window() && p.held.size() < kMaxHeld) {
      p.held.push_back(frame);
      return Status::Ok();
    }
    p.held.clear();
    return Status(ErrorCode::kPeerUnreachable,
                  "control socket: " + dest + " is not connected or its queue is full");
  }
};

ControlSocket::ControlSocket() : impl_(std::make_unique<Impl>()) {}
ControlSocket::~ControlSocket() = default;

Result<std::unique_ptr<ControlSocket>> ControlSocket::bind(const std::string& bind_endpoint) {
  std::unique_ptr<ControlSocket> s(new ControlSocket());
  try {
    zmq::socket_t pull(context(), zmq::socket_type::pull);
    pull.set(zmq::sockopt::linger, 0);
    pull.set(zmq::sockopt::maxmsgsize, kMaxFrameBytes);
    pull.bind(bind_endpoint);
    s->impl_->endpoint = pull.get(zmq::sockopt::last_endpoint);
    s->impl_->pull = std::move(pull);
  } catch (const zmq::error_t& e) {
    return Status(code_for(e), "control socket: cannot bind " + bind_endpoint + ": " + e.what());
  }
  return s;
}

const std::string& ControlSocket::endpoint() const { return impl_->endpoint; }

Status ControlSocket::send(const std::string& dest_endpoint, const std::string& frame) {
  auto it = impl_->pushes.find(dest_endpoint);
  if (it == impl_->pushes.end()) {
    try {
      zmq::socket_t push(context(), zmq::socket_type::push);
      push.set(zmq::sockopt::linger, 0);
      push.set(zmq::sockopt::sndhwm, kSendHighWaterMark);
      push.set(zmq::sockopt::immediate, true);
      push.connect(dest_endpoint);
      it = impl_->pushes.emplace(dest_endpoint, Push{std::move(push), Clock::now(), {}}).first;
    } catch (const zmq::error_t& e) {
      return Status(code_for(e),
                    "control socket: cannot connect to " + dest_endpoint + ": " + e.what());
    }
  }
  try {
    return impl_->queue(dest_endpoint, it->second, frame);
  } catch (const zmq::error_t& e) {
    return Status(ErrorCode::kPeerUnreachable,
                  "control socket: send to " + dest_endpoint + " failed: " + e.what());
  }
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

size_t ControlSocket::open_connections() const { return impl_->pushes.size(); }

}  // namespace kvferry
