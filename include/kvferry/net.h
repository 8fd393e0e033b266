// Addresses of kvferry's listening sockets (docs/network.md): every socket a rank or service
// listens on (bootstrap, control, heartbeat, engine agreement, router, metrics) has a bind address
// and an advertised address. The bind host is where the socket listens ("0.0.0.0", "::", an
// interface address, or a host name); the advertised host is what peers are told to connect to
// (a host name, IPv4 or IPv6 address). Loopback is only the default.
//
// Hosts are written without brackets inside kvferry ("::1"); brackets appear only where a port
// follows ("[::1]:8998", "tcp://[::1]:5601"). Inputs may carry them ("[::1]" is accepted as a host).
//
// Units: ports are TCP ports (0: any free port, the bound one is reported).
// Thread contract: value types and pure functions, except advertised() (reads the machine's host
// name for a wildcard bind) and resolve_host() (the system resolver: /etc/hosts, DNS; it may block
// for as long as the resolver does).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
  // Without brackets.
  std::string advertised() const;
};

// A ListenAddress from configuration where empty means "not given": bind_host empty is
// kDefaultHost, advertise_host empty is derived (ListenAddress::advertised). Brackets are removed.
ListenAddress make_listen_address(std::string_view bind_host, std::string_view advertise_host,
                                  uint16_t port = 0);

// The ListenAddress of a socket whose endpoint ("tcp://host:port", e.g. a --engine-endpoint that
// peers are also given) is configured, with optional overrides (empty: not given): it binds
// bind_host (default: the endpoint's host) and advertises advertise_host (default: the endpoint's
// host, or, when that is a wildcard, the machine's host name). Errors: kInvalidArgument naming
// the endpoint or host.
Result<ListenAddress> listen_address_for(std::string_view endpoint, std::string_view bind_host = {},
                                         std::string_view advertise_host = {});

// True for "0.0.0.0", "::", "[::]", "*" and "" (listen on every interface).
bool is_wildcard_host(std::string_view host);
// True for an IPv4 literal ("10.0.0.1"); false for IPv6, host names and "".
bool is_ipv4_literal(std::string_view host);
// True for an IPv6 literal ("::1", "[fd00::2]", "fe80::1%eth0"); false for IPv4 and host names.
bool is_ipv6_literal(std::string_view host);

// Checks a host given as configuration or by a peer: an IPv4 literal, an IPv6 literal (brackets
// optional, a %zone allowed), a host name (letters, digits, '-', '.', '_'; labels of 1..63, at
// most 253 bytes) or a wildcard (allow_wildcard). Returns it without brackets.
// Errors: kInvalidArgument naming the text and what is wrong with it.
Result<std::string> parse_host(std::string_view text, bool allow_wildcard = true);

// "tcp://host:port" for ZeroMQ, with an IPv6 literal in brackets ("tcp://[::1]:5601"); the
// wildcards "" and "*" become ZeroMQ's "*".
std::string zmq_endpoint(std::string_view host, uint16_t port);
// "host:port" for HTTP clients and logs, with an IPv6 literal in brackets ("[::1]:8998").
std::string host_port(std::string_view host, uint16_t port);

struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;
};
// Parses "host:port", "[v6]:port", "tcp://host:port" or "http://host:port" (host as parse_host;
// port 0..65535, or "*": 0, ZeroMQ's any port). An IPv6 literal needs brackets.
// Errors: kInvalidArgument naming the text.
Result<HostPort> parse_host_port(std::string_view text);

// The numeric addresses `host` resolves to for TCP (getaddrinfo, IPv4 and IPv6, in the resolver's
// order, duplicates removed, at most kMaxResolvedAddresses), without brackets. A literal resolves
// to itself. Errors: kInvalidArgument naming the host and the resolver's reason.
inline constexpr size_t kMaxResolvedAddresses = 8;
Result<std::vector<std::string>> resolve_host(std::string_view host);

// The host to give a socket API's bind (cpp-httplib, getaddrinfo with AI_PASSIVE): brackets
// removed; "*" and "" become "::" (every interface; IPv4 too on Linux's default dual stack).
std::string bind_host_for_socket(std::string_view host);

}  // namespace kvferry
