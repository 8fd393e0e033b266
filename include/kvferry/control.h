// ZeroMQ transport for control frames (src/control).
//
// A ControlSocket owns one bound PULL socket and one PUSH socket per destination endpoint, created
// on first use. It listens on a ListenAddress (kvferry/net.h): the bind host may be a wildcard, an
// IPv4 or IPv6 address or a host name (bound on every address it resolves to, one port); its
// endpoint() is the ADVERTISED one ("tcp://advertised-host:port", IPv6 in brackets), which is what
// peers are told and send to. Destinations may be IPv4, IPv6 ("tcp://[::1]:5601") or host names.
// send() never blocks: a frame that cannot be queued (peer gone, high-water mark) returns an error.
// Thread contract: NOT thread-safe; one thread owns a ControlSocket (ZeroMQ sockets are not
// thread-safe). Frames are opaque bytes here; see messages.h for their format.
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "kvferry/error.h"
#include "kvferry/net.h"

namespace kvferry {

namespace security {
struct ClusterKeys;  // src/core/secret.h
}

// What a control socket accepts and keeps (docs/security.md, "Bounded by the rank"): the largest
// frame (ZMQ_MAXMSGSIZE: a bigger one drops its connection before any of it is kept), frames
// queued per incoming connection (ZMQ_RCVHWM) and outgoing connections kept (the least recently
// used one without held frames is closed to make room for a new destination).
struct ControlLimits {
  // The largest frame a rank with `num_pages` pages per buffer can need: a few MiB, plus 8 bytes a
  // page (a RoomMetadata naming every page of the pool).
  static int64_t frame_bytes_for_pages(uint64_t num_pages);
  int64_t max_frame_bytes = frame_bytes_for_pages(1u << 20);
  int receive_high_water_mark = 1024;
  size_t max_connections = 1024;
};

class ControlSocket {
 public:
  // Binds a PULL socket on `address` (port 0: any free port). Errors: kInvalidArgument for a bad
  // or unresolvable host or a wildcard advertise_host; kInternal when it cannot bind (port taken,
  // no such local address).
  static Result<std::unique_ptr<ControlSocket>> bind(const ListenAddress& address);
  // Binds on an endpoint that is also what peers are told: "tcp://host:port" (port 0 or "*": any
  // free port) is bind(listen_address_for(endpoint)); other ZeroMQ transports (ipc://, inproc://)
  // are bound as given. Errors as above.
  static Result<std::unique_ptr<ControlSocket>> bind(const std::string& bind_endpoint);
  // Both use the process's cluster keys (KVFERRY_SECRET_FILE / KVFERRY_SECRET, docs/security.md):
  // with a secret set, the PULL socket is a CURVE server that admits only the cluster's key and
  // every PUSH socket a CURVE client; a bad secret file fails the bind with its reason. The same
  // with explicit keys (nullptr: no CURVE), which must outlive the socket (tests holding several
  // clusters' keys):
  static Result<std::unique_ptr<ControlSocket>> bind(const ListenAddress& address, const security::ClusterKeys* keys);
  static Result<std::unique_ptr<ControlSocket>> bind(const std::string& bind_endpoint,
                                                     const security::ClusterKeys* keys);
  // The same with explicit limits (the process's keys, or explicit ones).
  static Result<std::unique_ptr<ControlSocket>> bind(const ListenAddress& address, const ControlLimits& limits);
  static Result<std::unique_ptr<ControlSocket>> bind(const ListenAddress& address, const security::ClusterKeys* keys,
                                                     const ControlLimits& limits);
  ~ControlSocket();

  // The endpoint peers connect to: the advertised host and the bound port.
  const std::string& endpoint() const;
  // Where the socket really listens (ZeroMQ's last endpoint, e.g. "tcp://0.0.0.0:5601"), for logs.
  const std::string& bound_endpoint() const;

  // Queues `frame` to `dest_endpoint`. Errors: kPeerUnreachable when it cannot be queued;
  // kInvalidArgument for a malformed endpoint. Ok means queued, not delivered.
  // First contact: while the connection to a new destination is being set up (its first 1 s),
  // send() waits at most 20 ms once, then holds frames (in order, bounded) and later send()/recv()
  // calls flush them. Frames held when that window ends are dropped only if the connection never
  // came up; once it did, every frame send() accepted is kept until ZeroMQ queues it.
  Status send(const std::string& dest_endpoint, const std::string& frame);

  // Opens the connection to `dest_endpoint` if there is none and waits up to `timeout` until it is
  // up (kPeerUnreachable if it is not by then). Frames to a connected destination are never
  // dropped by the first-contact window, so a sender whose first frames matter (a router that
  // dispatches requests to an engine that just said it is ready, on a machine busy enough that a
  // loopback connect takes more than that window) waits here first.
  Status wait_connected(const std::string& dest_endpoint, std::chrono::milliseconds timeout);

  // Next received frame, waiting at most `timeout` (0: do not wait). nullopt when none arrived.
  std::optional<std::string> recv(std::chrono::milliseconds timeout);

  // Frames and bytes through this socket so far: sent counts frames send() accepted (queued or
  // held), received every frame recv() returned. Safe to read from any thread.
  struct Counters {
    uint64_t frames_sent = 0, bytes_sent = 0;
    uint64_t frames_received = 0, bytes_received = 0;
  };
  Counters counters() const;

  // Drops the PUSH socket to `dest_endpoint` (e.g. after the peer died), so a restarted peer on
  // the same endpoint gets a fresh connection.
  void forget(const std::string& dest_endpoint);

  // The file descriptor that becomes readable when frames may be waiting (ZMQ_FD semantics:
  // edge-like, drain with recv(0) until nullopt). It does not signal held outgoing frames.
  int fd() const;

  // Frames queued on the outgoing connections are still delivered for up to `time` after this
  // socket is closed (ZMQ_LINGER; every socket has 0 otherwise): for a last frame such as a
  // leaving heartbeat, best effort.
  void linger(std::chrono::milliseconds time);

  // Outgoing connections kept (at most ControlLimits::max_connections).
  size_t open_connections() const;
  // Whether a connection to `dest_endpoint` is kept (send() to it opens none).
  bool connected_to(const std::string& dest_endpoint) const;
  // Outgoing connections closed to make room for another destination.
  uint64_t evicted_connections() const;
  const ControlLimits& limits() const;

 private:
  ControlSocket();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvferry
