// Addresses of kvferry's listening sockets (docs/network.md): every socket a rank or service
// listens on (bootstrap, control, heartbeat, engine agreement, router, metrics) has a bind address
// and an advertised address. The bind host is where the socket listens ("0.0.0.0", "::", an
// interface address, or a host name); the advertised host is what peers are told to connect to
// (a host name, IPv4 or IPv6 address). Loopback is only the default.
//
// Units: ports are TCP ports (0: any free port, the bound one is reported).
// Thread contract: value types and pure functions.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "kvferry/error.h"

namespace kvferry {

// The default bind and advertised host: loopback, safe for one machine only.
inline constexpr std::string_view kDefaultHost = "127.0.0.1";

struct ListenAddress {
  std::string bind_host = std::string(kDefaultHost);
  std::string advertise_host;  // empty: the bind host, unless that is a wildcard ("0.0.0.0", "::"),
                               // then the machine's host name
  uint16_t port = 0;           // 0: any free port

  // The host peers are told: advertise_host, else bind_host (a wildcard becomes the host name).
  std::string advertised() const;
};

// True for "0.0.0.0", "::", "*" and "" (listen on every interface).
bool is_wildcard_host(std::string_view host);

// "tcp://host:port" for ZeroMQ, with an IPv6 literal in brackets ("tcp://[::1]:5601").
std::string zmq_endpoint(std::string_view host, uint16_t port);
// "host:port" for HTTP clients and logs, with an IPv6 literal in brackets ("[::1]:8998").
std::string host_port(std::string_view host, uint16_t port);

struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;
};
// Parses "host:port", "[v6]:port" or "tcp://host:port". Errors: kInvalidArgument naming the text.
Result<HostPort> parse_host_port(std::string_view text);

}  // namespace kvferry
