// The TCP congestion control of kvferry's data sockets (docs/transport.md "TCP congestion
// control").
//
// UCX opens the tcp lane's sockets itself and has no option for their congestion control, so
// they get the host's default. With BBR (a common default) a bulk transfer on loopback or inside a
// VM is paced by timers whose cost lands on the sending thread: on the 2-core VM of
// docs/BENCHMARKS.md, 1+1 tcp moved 3.4 GB/s under BBR and 6.1 GB/s under CUBIC. kvferry
// therefore sets an algorithm of its own choosing (TransportOptions::tcp_congestion) on the sockets
// UCX made for it, and on no other socket of the process (an engine embeds kvferry: its own
// sockets keep the host's choice).
//
// Which sockets are UCX's: UCX's packed worker address carries each tcp interface's IP address
// and listening port as raw bytes. A TCP socket of this process is taken as UCX's when
//   - it listens, and its bound address and port both occur in `own_address` (sockets UCX accepts
//     later inherit the listener's algorithm), or
//   - it is connected, and either its local address and port occur in `own_address` (accepted by
//     UCX's listener) or its peer's address and port occur in `peer_address` (UCX connected it).
// On a loopback address the port alone decides: UCX names a loopback interface by the host's
// boot id and network namespace, not by 127.0.0.1. A wildcard or zero address never matches. A false match (another socket of the process to the
// same host and port bytes) only changes that socket's congestion control.
//
// Thread contract: any thread; it reads /proc/self/fd and calls getsockopt/setsockopt on the
// descriptors it finds (a descriptor closed meanwhile fails one call and is skipped).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace kvferry::ucx {

struct CongestionOutcome {
  uint32_t tuned = 0;    // sockets switched to the algorithm
  uint32_t already = 0;  // UCX's sockets that had it already
  uint32_t failed = 0;   // UCX's sockets where TCP_CONGESTION was refused
  std::string error;     // the first refusal: "setsockopt(TCP_CONGESTION, \"x\"): <strerror>"
};

// Sets `algo` (a name of /proc/sys/net/ipv4/tcp_available_congestion_control; an unprivileged
// process may only pick those of tcp_allowed_congestion_control) on UCX's sockets as above.
// `peer_address` may be empty (only the process's own listeners and accepted sockets then).
CongestionOutcome set_ucx_congestion(const std::string& algo, std::string_view own_address,
                                     std::string_view peer_address);

// The rule above for one socket address: its port bytes, and its address bytes unless it is a
// loopback address, occur in `blob`; never for a wildcard address or port 0.
bool names_socket_address(const sockaddr_storage& address, std::string_view blob);

// The congestion control of socket `fd` ("" when it is not a TCP socket).
std::string socket_congestion(int fd);

}  // namespace kvferry::ucx
