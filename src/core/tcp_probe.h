// What a TCP connect to a "tcp://HOST:PORT" endpoint finds (HOST: IPv4, [IPv6] or a host name;
// each of its resolved addresses tried within `timeout_ms` in all). It sends nothing: a SYN, then
// a close. Blocking (at most timeout_ms); call it off any loop that must not stall.
//   kAccepts: some address accepted (a process listens there);
//   kUnanswered: none accepted and some got no answer within the budget or had no route
//     (ETIMEDOUT, ENETUNREACH, EHOSTUNREACH, ENETDOWN, EHOSTDOWN): the network is silent;
//   kRefused: every address refused (nothing listens: the process is gone), or the endpoint cannot
//     be probed (unparsable, unresolvable, a wildcard, port 0, not tcp).
#pragma once

#include <string>

namespace kvferry {

enum class TcpProbe { kAccepts, kUnanswered, kRefused };

TcpProbe probe_tcp_endpoint(const std::string& endpoint, int timeout_ms);

}  // namespace kvferry
