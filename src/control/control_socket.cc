// ControlSocket over ZeroMQ (include/kvferry/control.h): one bound PULL socket, PUSH sockets per
// destination created on first send.
//
// PUSH sockets use ZMQ_IMMEDIATE=1: frames are queued only on a completed connection, so a send to
// a dead or never-started peer fails at once (kPeerUnreachable) instead of piling up. A PUSH
// socket that has just been created has not finished its TCP connect yet, so during its first
// kConnectGrace a send that would block waits (bounded) for the connection; after that, sends
// never wait. All sockets have ZMQ_LINGER 0: closing never blocks on unsent frames.
#include <chrono>
#include <unordered_map>
#include <zmq.hpp>

#include "kvferry/control.h"
#include "kvferry/messages.h"

namespace kvferry {
namespace {

constexpr int kSendHighWaterMark = 10000;
constexpr auto kConnectGrace = std::chrono::milliseconds(50);
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

struct Push {
  zmq::socket_t socket;
  std::chrono::steady_clock::time_point created;
};

}  // namespace

struct ControlSocket::Impl {
  zmq::socket_t pull;
  std::string endpoint;
  std::unordered_map<std::string, Push> pushes;

  // Sends without blocking; on a fresh socket waits up to the rest of kConnectGrace for the
  // connection. Returns false when the frame could not be queued.
  static bool send_on(Push& p, const std::string& frame) {
    if (p.socket.send(zmq::buffer(frame), zmq::send_flags::dontwait)) return true;
    const auto left = kConnectGrace - (std::chrono::steady_clock::now() - p.created);
    if (left <= std::chrono::milliseconds(0)) return false;
    zmq::pollitem_t item{p.socket.handle(), 0, ZMQ_POLLOUT, 0};
    zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(left) +
                            std::chrono::milliseconds(1));
    if (!(item.revents & ZMQ_POLLOUT)) return false;
    return p.socket.send(zmq::buffer(frame), zmq::send_flags::dontwait).has_value();
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
      it = impl_->pushes
               .emplace(dest_endpoint, Push{std::move(push), std::chrono::steady_clock::now()})
               .first;
    } catch (const zmq::error_t& e) {
      return Status(code_for(e),
                    "control socket: cannot connect to " + dest_endpoint + ": " + e.what());
    }
  }
  try {
    if (Impl::send_on(it->second, frame)) return Status::Ok();
  } catch (const zmq::error_t& e) {
    return Status(ErrorCode::kPeerUnreachable,
                  "control socket: send to " + dest_endpoint + " failed: " + e.what());
  }
  return Status(ErrorCode::kPeerUnreachable,
                "control socket: " + dest_endpoint + " is not connected or its queue is full");
}

std::optional<std::string> ControlSocket::recv(std::chrono::milliseconds timeout) {
  try {
    zmq::message_t msg;
    auto got = impl_->pull.recv(msg, zmq::recv_flags::dontwait);
    if (!got && timeout.count() > 0) {
      zmq::pollitem_t item{impl_->pull.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, timeout);
      if (item.revents & ZMQ_POLLIN) got = impl_->pull.recv(msg, zmq::recv_flags::dontwait);
    }
    if (!got) return std::nullopt;
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
