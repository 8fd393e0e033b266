// ZeroMQ transport for control frames (src/control).
//
// A ControlSocket owns one bound PULL socket (its endpoint, e.g. "tcp://127.0.0.1:5601", is what
// peers send to) and one PUSH socket per destination endpoint, created on first use.
// send() never blocks: a frame that cannot be queued (peer gone, high-water mark) returns an error.
// Thread contract: NOT thread-safe; one thread owns a ControlSocket (ZeroMQ sockets are not
// thread-safe). Frames are opaque bytes here; see messages.h for their format.
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "kvferry/error.h"

namespace kvferry {

class ControlSocket {
 public:
  // Binds a PULL socket on `bind_endpoint` ("tcp://127.0.0.1:0" picks a free port).
  static Result<std::unique_ptr<ControlSocket>> bind(const std::string& bind_endpoint);
  ~ControlSocket();

  // The endpoint peers connect to (port resolved).
  const std::string& endpoint() const;

  // Queues `frame` to `dest_endpoint`. Errors: kPeerUnreachable when it cannot be queued;
  // kInvalidArgument for a malformed endpoint. Ok means queued, not delivered.
  // First contact: while the connection to a new destination is being set up (its first 1 s),
  // send() waits at most 20 ms once, then holds frames (in order, bounded) and later send()/recv()
  // calls flush them; frames still held when that window ends are dropped.
  Status send(const std::string& dest_endpoint, const std::string& frame);

  // Next received frame, waiting at most `timeout` (0: do not wait). nullopt when none arrived.
  std::optional<std::string> recv(std::chrono::milliseconds timeout);

  // Drops the PUSH socket to `dest_endpoint` (e.g. after the peer died), so a restarted peer on
  // the same endpoint gets a fresh connection.
  void forget(const std::string& dest_endpoint);

  // The file descriptor that becomes readable when frames may be waiting (ZMQ_FD semantics:
  // edge-like, drain with recv(0) until nullopt). It does not signal held outgoing frames.
  int fd() const;

  size_t open_connections() const;

 private:
  ControlSocket();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvferry
