// Host and endpoint parsing for kvferry's sockets (include/kvferry/net.h, docs/network.md).
#include "kvferry/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <memory>

namespace kvferry {
namespace {

constexpr size_t kMaxHostName = 253;
constexpr size_t kMaxLabel = 63;

std::string_view strip_brackets(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

Status bad(std::string_view text, std::string_view why) {
  return Status(ErrorCode::kInvalidArgument, "address '" + std::string(text.substr(0, 256)) + "': " +
                                                 std::string(why));
}

bool valid_host_name(std::string_view host) {
  if (host.empty() || host.size() > kMaxHostName) return false;
  size_t label = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    const char c = host[i];
    if (c == '.') {
      if (label == 0 || host[i - 1] == '-') return false;
      label = 0;
      continue;
    }
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && c != '-' && c != '_') return false;
    if (label == 0 && c == '-') return false;
    if (++label > kMaxLabel) return false;
  }
  return label > 0 && host.back() != '-';
}

}  // namespace

std::string ListenAddress::advertised() const {
  if (!advertise_host.empty()) return std::string(strip_brackets(advertise_host));
  if (!is_wildcard_host(bind_host)) return std::string(strip_brackets(bind_host));
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') return name;
  return std::string(kDefaultHost);
}

ListenAddress make_listen_address(std::string_view bind_host, std::string_view advertise_host, uint16_t port) {
  ListenAddress a;
  a.bind_host = bind_host.empty() ? std::string(kDefaultHost) : std::string(strip_brackets(bind_host));
  a.advertise_host = std::string(strip_brackets(advertise_host));
  a.port = port;
  return a;
}

Result<ListenAddress> listen_address_for(std::string_view endpoint, std::string_view bind_host,
                                         std::string_view advertise_host) {
  auto hp = parse_host_port(endpoint);
  if (!hp.ok()) return hp.status();
  ListenAddress a;
  a.port = hp->port;
  if (bind_host.empty()) {
    a.bind_host = hp->host;
  } else {
    auto b = parse_host(bind_host);
    if (!b.ok()) return b.status();
    a.bind_host = *b;
  }
  if (!advertise_host.empty()) {
    auto adv = parse_host(advertise_host, /*allow_wildcard=*/false);
    if (!adv.ok()) return adv.status();
    a.advertise_host = *adv;
  } else if (!is_wildcard_host(hp->host)) {
    a.advertise_host = hp->host;
  }
  return a;
}

bool is_wildcard_host(std::string_view host) {
  host = strip_brackets(host);
  return host.empty() || host == "*" || host == "0.0.0.0" || host == "::";
}

bool is_ipv4_literal(std::string_view host) {
  if (host.find('\0') != std::string_view::npos) return false;  // inet_pton would stop there
  in_addr a{};
  return ::inet_pton(AF_INET, std::string(host).c_str(), &a) == 1;
}

bool is_ipv6_literal(std::string_view host) {
  host = strip_brackets(host);
  if (host.find(':') == std::string_view::npos || host.find('\0') != std::string_view::npos) return false;
  const std::string_view addr = host.substr(0, host.find('%'));  // fe80::1%eth0: link-local zone
  if (addr.size() != host.size() && addr.size() + 1 == host.size()) return false;  // empty zone
  in6_addr a{};
  return ::inet_pton(AF_INET6, std::string(addr).c_str(), &a) == 1;
}

Result<std::string> parse_host(std::string_view text, bool allow_wildcard) {
  const bool bracketed = text.size() >= 2 && text.front() == '[' && text.back() == ']';
  const std::string_view host = strip_brackets(text);
  if (is_wildcard_host(host)) {
    if (!allow_wildcard) return bad(text, "a wildcard cannot be advertised to peers (give a host name or address)");
    return std::string(host);
  }
  if (host.find(':') != std::string_view::npos) {
    if (!is_ipv6_literal(host)) return bad(text, "not a valid IPv6 address");
    return std::string(host);
  }
  if (bracketed) return bad(text, "brackets are only for IPv6 addresses");
  if (is_ipv4_literal(host)) return std::string(host);
  // Only digits and dots but not an IPv4 address ("999.1.1.1", "10.1"): a typo, not a host name.
  if (host.find_first_not_of("0123456789.") == std::string_view::npos) return bad(text, "not a valid IPv4 address");
  if (!valid_host_name(host)) return bad(text, "not a valid host name");
  return std::string(host);
}

std::string zmq_endpoint(std::string_view host, uint16_t port) {
  host = strip_brackets(host);
  std::string out = "tcp://";
  out.append(host.empty() || host == "*" ? "*:" + std::to_string(port) : host_port(host, port));
  return out;
}

std::string host_port(std::string_view host, uint16_t port) {
  host = strip_brackets(host);
  const bool v6 = host.find(':') != std::string_view::npos;
  std::string out;
  out.reserve(host.size() + 8);
  if (v6) out.push_back('[');
  out.append(host);
  if (v6) out.push_back(']');
  out.push_back(':');
  out.append(std::to_string(port));
  return out;
}

Result<HostPort> parse_host_port(std::string_view text) {
  std::string_view t = text;
  for (std::string_view scheme : {"tcp://", "http://"}) {
    if (t.substr(0, scheme.size()) == scheme) {
      t.remove_prefix(scheme.size());
      break;
    }
  }
  if (t.find("://") != std::string_view::npos) return bad(text, "only tcp:// and http:// endpoints are supported");
  std::string_view host, port;
  if (!t.empty() && t.front() == '[') {
    const size_t close = t.find(']');
    if (close == std::string_view::npos) return bad(text, "'[' without ']'");
    if (close + 1 >= t.size() || t[close + 1] != ':') return bad(text, "expected host:port");
    host = t.substr(0, close + 1);
    port = t.substr(close + 2);
  } else {
    const size_t colon = t.rfind(':');
    if (colon == std::string_view::npos) return bad(text, "expected host:port");
    host = t.substr(0, colon);
    port = t.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return bad(text, "an IPv6 address needs brackets: [address]:port");
    }
  }
  if (host.empty()) return bad(text, "no host before the port");
  auto h = parse_host(host);
  if (!h.ok()) return h.status();
  HostPort out{std::move(h).value(), 0};
  if (port == "*") return out;
  uint32_t p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p > 65535) {
    return bad(text, "the port must be 0..65535");
  }
  out.port = static_cast<uint16_t>(p);
  return out;
}

Result<std::vector<std::string>> resolve_host(std::string_view host_text) {
  auto parsed = parse_host(host_text, /*allow_wildcard=*/false);
  if (!parsed.ok()) return parsed.status();
  const std::string& host = *parsed;
  if (is_ipv4_literal(host) || is_ipv6_literal(host)) return std::vector<std::string>{host};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return bad(host, std::string("does not resolve: ") + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  std::vector<std::string> out;
  for (const addrinfo* ai = res; ai != nullptr && out.size() < kMaxResolvedAddresses; ai = ai->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src = nullptr;
    if (ai->ai_family == AF_INET) src = &reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_addr;
    if (ai->ai_family == AF_INET6) src = &reinterpret_cast<const sockaddr_in6*>(ai->ai_addr)->sin6_addr;
    if (src == nullptr || ::inet_ntop(ai->ai_family, src, buf, sizeof buf) == nullptr) continue;
    if (std::find(out.begin(), out.end(), buf) == out.end()) out.emplace_back(buf);
  }
  if (out.empty()) return bad(host, "resolves to no IPv4 or IPv6 address");
  return out;
}

std::string bind_host_for_socket(std::string_view host) {
  host = strip_brackets(host);
  if (host.empty() || host == "*") return "::";
  return std::string(host);
}

}  // namespace kvferry
