// Hosts, endpoints and listen addresses (kvferry/net.h): IPv6 brackets, host names, wildcards and
// malformed input.
#include "kvferry/net.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>

namespace kvferry {
namespace {

std::string machine_name() {
  char name[HOST_NAME_MAX + 1] = {};
  EXPECT_EQ(::gethostname(name, sizeof name - 1), 0);
  return name;
}

TEST(Net, Wildcards) {
  for (const char* w : {"", "*", "0.0.0.0", "::", "[::]"}) EXPECT_TRUE(is_wildcard_host(w)) << w;
  for (const char* h : {"127.0.0.1", "::1", "localhost", "0.0.0.1", "::2"}) EXPECT_FALSE(is_wildcard_host(h)) << h;
}

TEST(Net, Ipv6Literals) {
  for (const char* h : {"::1", "[::1]", "fd00::2", "2001:db8::8a2e:370:7334", "fe80::1%eth0", "::"})
    EXPECT_TRUE(is_ipv6_literal(h)) << h;
  for (const char* h : {"127.0.0.1", "localhost", "", "1::2::3", "fe80::1%", "[::1", "g::1"})
    EXPECT_FALSE(is_ipv6_literal(h)) << h;
}

TEST(Net, ZmqEndpointAndHostPort) {
  EXPECT_EQ(zmq_endpoint("127.0.0.1", 5601), "tcp://127.0.0.1:5601");
  EXPECT_EQ(zmq_endpoint("::1", 5601), "tcp://[::1]:5601");
  EXPECT_EQ(zmq_endpoint("[::1]", 5601), "tcp://[::1]:5601");  // never double brackets
  EXPECT_EQ(zmq_endpoint("localhost", 0), "tcp://localhost:0");
  EXPECT_EQ(zmq_endpoint("*", 7), "tcp://*:7");
  EXPECT_EQ(zmq_endpoint("", 7), "tcp://*:7");
  EXPECT_EQ(zmq_endpoint("::", 7), "tcp://[::]:7");
  EXPECT_EQ(host_port("10.1.2.3", 8998), "10.1.2.3:8998");
  EXPECT_EQ(host_port("fd00::2", 8998), "[fd00::2]:8998");
  EXPECT_EQ(host_port("[fd00::2]", 8998), "[fd00::2]:8998");
  EXPECT_EQ(host_port("prefill-0.cluster", 65535), "prefill-0.cluster:65535");
}

TEST(Net, ParseHostPort) {
  struct Case {
    const char* text;
    const char* host;
    uint16_t port;
  };
  for (const Case& c : {Case{"127.0.0.1:8998", "127.0.0.1", 8998}, Case{"[::1]:8998", "::1", 8998},
                        Case{"tcp://[fd00::2]:5601", "fd00::2", 5601}, Case{"tcp://10.0.0.1:0", "10.0.0.1", 0},
                        Case{"http://localhost:80", "localhost", 80}, Case{"decode-3.svc.local:65535", "decode-3.svc.local", 65535},
                        Case{"tcp://127.0.0.1:*", "127.0.0.1", 0}, Case{"tcp://*:5600", "*", 5600},
                        Case{"[::]:1", "::", 1}, Case{"0.0.0.0:2", "0.0.0.0", 2}}) {
    auto r = parse_host_port(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status().str();
    EXPECT_EQ(r->host, c.host) << c.text;
    EXPECT_EQ(r->port, c.port) << c.text;
  }
}

TEST(Net, ParseHostPortRejectsBadInput) {
  for (const char* text : {"", "no-port-here", "127.0.0.1", "127.0.0.1:", ":8998", "::1:8998", "[::1]8998",
                           "[::1:8998", "[::1]", "[localhost]:1", "[::g]:1", "127.0.0.1:65536", "127.0.0.1:-1",
                           "127.0.0.1:12x", "127.0.0.1: 1", "host name:1", "999.1.1.1:5", "10.1:5",
                           "-bad.example:1", "bad-.example:1", "a..b:1", "ipc:///tmp/x", "udp://1.2.3.4:5",
                           "tcp://", "a/b:1"}) {
    auto r = parse_host_port(text);
    ASSERT_FALSE(r.ok()) << "accepted '" << text << "' as " << r.value().host << " " << r.value().port;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << text;
    EXPECT_NE(r.status().message().find("address '"), std::string::npos) << r.status().str();
  }
  EXPECT_NE(parse_host_port("::1:8998").status().message().find("brackets"), std::string::npos);
  const std::string long_label(64, 'a');
  EXPECT_FALSE(parse_host_port(long_label + ".example:1").ok());
  EXPECT_TRUE(parse_host_port(std::string(63, 'a') + ".example:1").ok());
  std::string long_name;
  while (long_name.size() < 260) long_name += "abcdefghi.";
  EXPECT_FALSE(parse_host_port(long_name + "x:1").ok());
}

TEST(Net, ParseHost) {
  EXPECT_EQ(parse_host("[::1]").value(), "::1");
  EXPECT_EQ(parse_host("localhost").value(), "localhost");
  EXPECT_EQ(parse_host("10.0.0.7").value(), "10.0.0.7");
  EXPECT_EQ(parse_host("0.0.0.0").value(), "0.0.0.0");
  EXPECT_EQ(parse_host("[::]").value(), "::");
  auto w = parse_host("0.0.0.0", /*allow_wildcard=*/false);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("wildcard"), std::string::npos) << w.status().str();
  EXPECT_FALSE(parse_host("::", false).ok());
  EXPECT_FALSE(parse_host("[10.0.0.7]").ok());
  EXPECT_FALSE(parse_host("1.2.3.4.5").ok());
  EXPECT_FALSE(parse_host("exa mple").ok());
  EXPECT_FALSE(parse_host(std::string("a\0b", 3)).ok());
  EXPECT_FALSE(parse_host(std::string("10.0.0.1\0x", 10)).ok());  // no NUL-truncated literals
  EXPECT_FALSE(parse_host(std::string("::1\0x", 5)).ok());
  EXPECT_TRUE(is_ipv4_literal("10.0.0.1"));
  EXPECT_FALSE(is_ipv4_literal("::1"));
  EXPECT_FALSE(is_ipv4_literal("localhost"));
}

TEST(Net, AdvertisedHost) {
  ListenAddress a;
  EXPECT_EQ(a.bind_host, kDefaultHost);
  EXPECT_EQ(a.advertised(), kDefaultHost);
  a.bind_host = "::1";
  EXPECT_EQ(a.advertised(), "::1");
  a.bind_host = "0.0.0.0";
  EXPECT_EQ(a.advertised(), machine_name());  // a wildcard is not an address peers can use
  a.bind_host = "::";
  EXPECT_EQ(a.advertised(), machine_name());
  a.advertise_host = "prefill-0.example";
  EXPECT_EQ(a.advertised(), "prefill-0.example");
  a.advertise_host = "[fd00::2]";
  EXPECT_EQ(a.advertised(), "fd00::2");
}

TEST(Net, MakeListenAddress) {
  ListenAddress d = make_listen_address("", "", 0);
  EXPECT_EQ(d.bind_host, kDefaultHost);
  EXPECT_EQ(d.advertised(), kDefaultHost);
  ListenAddress w = make_listen_address("[::]", "[fd00::3]", 77);
  EXPECT_EQ(w.bind_host, "::");
  EXPECT_EQ(w.advertise_host, "fd00::3");
  EXPECT_EQ(w.port, 77);
}

TEST(Net, ListenAddressForEndpoint) {
  // The endpoint's host is both bound and advertised by default.
  auto plain = listen_address_for("tcp://10.0.0.1:5600");
  ASSERT_TRUE(plain.ok()) << plain.status().str();
  EXPECT_EQ(plain->bind_host, "10.0.0.1");
  EXPECT_EQ(plain->advertised(), "10.0.0.1");
  EXPECT_EQ(plain->port, 5600);
  // --bind-host listens elsewhere; peers are still told the endpoint's host.
  auto wild = listen_address_for("tcp://[fd00::2]:0", "::");
  ASSERT_TRUE(wild.ok()) << wild.status().str();
  EXPECT_EQ(wild->bind_host, "::");
  EXPECT_EQ(wild->advertised(), "fd00::2");
  auto adv = listen_address_for("tcp://127.0.0.1:9", "0.0.0.0", "decode-1");
  ASSERT_TRUE(adv.ok());
  EXPECT_EQ(adv->bind_host, "0.0.0.0");
  EXPECT_EQ(adv->advertised(), "decode-1");
  auto star = listen_address_for("tcp://*:9");
  ASSERT_TRUE(star.ok());
  EXPECT_EQ(star->advertised(), machine_name());
  EXPECT_FALSE(listen_address_for("tcp://127.0.0.1:9", "bad host").ok());
  EXPECT_FALSE(listen_address_for("tcp://127.0.0.1:9", "", "0.0.0.0").ok());  // cannot advertise a wildcard
  EXPECT_FALSE(listen_address_for("127.0.0.1").ok());
}

TEST(Net, ResolveHost) {
  EXPECT_EQ(resolve_host("127.0.0.1").value(), std::vector<std::string>{"127.0.0.1"});
  EXPECT_EQ(resolve_host("[::1]").value(), std::vector<std::string>{"::1"});
  auto local = resolve_host("localhost");
  ASSERT_TRUE(local.ok()) << local.status().str();
  ASSERT_FALSE(local->empty());
  for (const std::string& a : *local) EXPECT_TRUE(a == "127.0.0.1" || a == "::1") << a;
  auto none = resolve_host("no-such-host.invalid");  // RFC 6761: .invalid never resolves
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("does not resolve"), std::string::npos) << none.status().str();
  EXPECT_FALSE(resolve_host("0.0.0.0").ok());
  EXPECT_FALSE(resolve_host("bad host").ok());
}

TEST(Net, BindHostForSocket) {
  EXPECT_EQ(bind_host_for_socket("*"), "::");
  EXPECT_EQ(bind_host_for_socket(""), "::");
  EXPECT_EQ(bind_host_for_socket("[::1]"), "::1");
  EXPECT_EQ(bind_host_for_socket("0.0.0.0"), "0.0.0.0");
  EXPECT_EQ(bind_host_for_socket("localhost"), "localhost");
}

}  // namespace
}  // namespace kvferry
