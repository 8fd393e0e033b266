// CURVE for the control plane's ZeroMQ sockets (docs/security.md): the one ZeroMQ context of the
// process, the ZAP handler (inproc://zeromq.zap.01, one per process) and the socket options.
//
// A binding socket with keys is a CURVE server whose ZAP domain is the hex of the cluster's public
// key; the ZAP handler admits a client only when its CURVE public key is that key (so a process
// holding several clusters' keys, as the unit tests do, keeps them apart). A connecting socket is
// a CURVE client with the cluster's keypair and the cluster's key as the server key. A peer without
// the secret fails the handshake (it cannot know the server key); one that knows the server key but
// not the secret key is refused by ZAP (counted in zap_refusals()).
// Thread contract: all functions are thread-safe; the ZAP handler runs on its own thread for the
// life of the process.
#pragma once
#include <cstdint>
#include <zmq.hpp>

#include "core/secret.h"
#include "kvferry/error.h"

namespace kvferry::control {

// One context per process, never destroyed: destroying it at exit would block on any socket a
// caller leaked (zmq_ctx_term waits for every socket to close).
zmq::context_t& context();

// Makes `s` (not yet bound) a CURVE server with `keys`, starting the ZAP handler on first use.
// kInternal when the handler cannot be started.
Status make_curve_server(zmq::socket_t& s, const security::ClusterKeys& keys);
// Makes `s` (not yet connected) a CURVE client of a server with `keys`.
void make_curve_client(zmq::socket_t& s, const security::ClusterKeys& keys);

// Handshakes the ZAP handler admitted / refused since the process started.
uint64_t zap_admissions();
uint64_t zap_refusals();

}  // namespace kvferry::control
