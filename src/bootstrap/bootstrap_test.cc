#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "bootstrap/rank_info_json.h"
#include "kvferry/bootstrap.h"
#include "kvferry/net.h"

namespace kvferry {
namespace {

PrefillRankInfo rank(uint32_t tp, const std::string& endpoint) {
  PrefillRankInfo r;
  r.engine_id = 1;
  r.dp_rank = 0;
  r.tp_rank = tp;
  r.tp_size = 2;
  r.host = "127.0.0.1";
  r.control_endpoint = endpoint;
  r.page_size = 16;
  r.dtype = "bfloat16";
  r.model = "llama3-8b";
  r.num_layers = 32;
  r.heads_per_rank = 4;
  r.first_head = 4 * tp;
  r.incarnation = 1'764'000'000'000'000'000ull + tp;  // above 2^53: kept exactly in JSON
  r.transport_address = std::string("\x00\x01binary\xff\xfe", 10) + std::to_string(tp);  // any bytes
  return r;
}

void expect_same(const PrefillRankInfo& a, const PrefillRankInfo& b) {
  EXPECT_EQ(a.engine_id, b.engine_id);
  EXPECT_EQ(a.dp_rank, b.dp_rank);
  EXPECT_EQ(a.tp_rank, b.tp_rank);
  EXPECT_EQ(a.tp_size, b.tp_size);
  EXPECT_EQ(a.host, b.host);
  EXPECT_EQ(a.control_endpoint, b.control_endpoint);
  EXPECT_EQ(a.page_size, b.page_size);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.heads_per_rank, b.heads_per_rank);
  EXPECT_EQ(a.first_head, b.first_head);
  EXPECT_EQ(a.incarnation, b.incarnation);
  EXPECT_EQ(a.transport_address, b.transport_address);
}

class Bootstrap : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = BootstrapServer::start("127.0.0.1", 0);
    ASSERT_TRUE(s.ok()) << s.status().str();
    server_ = std::move(s).value();
    ASSERT_GT(server_->port(), 0);
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  std::unique_ptr<BootstrapServer> server_;
  std::string address_;
};

TEST_F(Bootstrap, RegisterLookupHealth) {
  BootstrapClient c(address_, 2000);
  ASSERT_EQ(c.health().value(), 0u);
  ASSERT_TRUE(c.register_rank(rank(0, "tcp://127.0.0.1:5600")).ok());
  ASSERT_TRUE(c.register_rank(rank(1, "tcp://127.0.0.1:5601")).ok());
  EXPECT_EQ(server_->registered(), 2u);
  EXPECT_EQ(c.health().value(), 2u);

  auto r0 = c.lookup(1, 0, 0);
  ASSERT_TRUE(r0.ok()) << r0.status().str();
  expect_same(*r0, rank(0, "tcp://127.0.0.1:5600"));
  auto r1 = c.lookup(1, 0, 1);
  ASSERT_TRUE(r1.ok()) << r1.status().str();
  expect_same(*r1, rank(1, "tcp://127.0.0.1:5601"));

  auto all = c.lookup_all(1, 0);
  ASSERT_TRUE(all.ok()) << all.status().str();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].tp_rank, 0u);
  EXPECT_EQ((*all)[1].tp_rank, 1u);
  // Other engines and dp ranks see nothing.
  EXPECT_EQ(c.lookup_all(0, 0).value().size(), 0u);
  EXPECT_EQ(c.lookup_all(1, 1).value().size(), 0u);
}

TEST_F(Bootstrap, MissingRankIsNotRegistered) {
  BootstrapClient c(address_);
  ASSERT_TRUE(c.register_rank(rank(0, "tcp://127.0.0.1:5600")).ok());
  auto r = c.lookup(1, 0, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not registered"), std::string::npos) << r.status().str();
}

TEST_F(Bootstrap, ReRegisterReplaces) {
  BootstrapClient c(address_);
  ASSERT_TRUE(c.register_rank(rank(0, "tcp://127.0.0.1:5600")).ok());
  ASSERT_TRUE(c.register_rank(rank(0, "tcp://127.0.0.1:7777")).ok());  // restarted rank
  EXPECT_EQ(c.health().value(), 1u);
  EXPECT_EQ(c.lookup(1, 0, 0).value().control_endpoint, "tcp://127.0.0.1:7777");
}

TEST_F(Bootstrap, ClientRejectsInvalidRankInfo) {
  BootstrapClient c(address_);
  PrefillRankInfo bad = rank(2, "tcp://127.0.0.1:5602");  // tp_rank 2 with tp_size 2
  Status s = c.register_rank(bad);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.str();
  EXPECT_NE(s.message().find("tp_rank"), std::string::npos) << s.str();
  EXPECT_EQ(server_->registered(), 0u);
}

// Issue 31: an entry is replaced by the same or a newer incarnation only; an older one is refused
// (the entry stays) and counted; each real replacement is counted.
TEST_F(Bootstrap, OlderIncarnationNeverReplacesANewerOne) {
  BootstrapClient c(address_, 2000);
  PrefillRankInfo r = rank(0, "tcp://127.0.0.1:5600");
  ASSERT_TRUE(c.register_rank(r).ok());
  ASSERT_TRUE(c.register_rank(r).ok());  // the same again: no replacement
  EXPECT_EQ(server_->overwrites(), 0u);
  PrefillRankInfo older = r;
  older.incarnation = r.incarnation - 1;
  older.control_endpoint = "tcp://127.0.0.1:6666";
  Status s = c.register_rank(older);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.str();
  EXPECT_NE(s.message().find("older than the registered"), std::string::npos) << s.str();
  EXPECT_EQ(c.lookup(1, 0, 0)->control_endpoint, "tcp://127.0.0.1:5600");
  EXPECT_EQ(server_->refused_overwrites(), 1u);
  PrefillRankInfo newer = r;
  newer.incarnation = r.incarnation + 1;
  newer.control_endpoint = "tcp://127.0.0.1:5700";
  ASSERT_TRUE(c.register_rank(newer).ok());
  EXPECT_EQ(c.lookup(1, 0, 0)->control_endpoint, "tcp://127.0.0.1:5700");
  EXPECT_EQ(server_->overwrites(), 1u);
  // One far in the future (it would lock every later restart out) is refused, the entry stays.
  PrefillRankInfo future = r;
  future.incarnation = UINT64_MAX;
  future.control_endpoint = "tcp://127.0.0.1:29999";
  s = c.register_rank(future);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.str();
  EXPECT_NE(s.message().find("ahead of this service's clock"), std::string::npos) << s.str();
  EXPECT_EQ(c.lookup(1, 0, 0)->control_endpoint, "tcp://127.0.0.1:5700");
}

// A TCP listener on 127.0.0.1 (a rank's control port, as a probe sees it); close() makes its
// endpoint refuse connects, as a killed rank's does.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    endpoint_ = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }
  ~Listener() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  int fd_ = -1;
  std::string endpoint_;
};

// Issue 31, attack 2b: without the secret, PUTs of a prefill rank's own entry (copied from GET
// /route) stamped now + 59 s, re-sent every 200 ms, made its restart's PUT "older than the
// registered" one, so the restarted rank exited. Now an older PUT replaces a newer entry whose
// endpoint refuses connects when its own accepts them, and a newer PUT naming a dead endpoint never
// replaces a live entry. A PUT at the same endpoint keeps the newer incarnation and succeeds.
TEST_F(Bootstrap, ACopiedEntryStampedAheadDoesNotLockARestartedRankOut) {
  BootstrapClient c(address_, 2000);
  Listener first;
  ASSERT_FALSE(first.endpoint().empty());
  PrefillRankInfo real = rank(0, first.endpoint());
  real.incarnation = static_cast<uint64_t>(realtime_ns());
  ASSERT_TRUE(c.register_rank(real).ok());
  PrefillRankInfo liar = real;
  liar.incarnation = real.incarnation + 59'000'000'000ull;
  ASSERT_TRUE(c.register_rank(liar).ok());  // the same endpoint, newer: nothing tells them apart
  // Restarted on the same port: its PUT succeeds, the entry still leads to it.
  PrefillRankInfo same_port = real;
  same_port.incarnation = real.incarnation + 1'000'000'000ull;
  Status s = c.register_rank(same_port);
  EXPECT_TRUE(s.ok()) << s.str();
  EXPECT_EQ(c.lookup(1, 0, 0)->control_endpoint, first.endpoint());
  // Killed, restarted elsewhere: its older PUT replaces the entry that names the dead endpoint.
  first.close();
  Listener second;
  PrefillRankInfo restarted = real;
  restarted.control_endpoint = second.endpoint();
  restarted.incarnation = real.incarnation + 2'000'000'000ull;
  s = c.register_rank(restarted);
  ASSERT_TRUE(s.ok()) << s.str();
  EXPECT_EQ(c.lookup(1, 0, 0)->control_endpoint, second.endpoint());
  EXPECT_EQ(c.lookup(1, 0, 0)->incarnation, restarted.incarnation);
  // The liar again, newer still, at the dead endpoint: refused while the restarted rank's accepts.
  liar.incarnation += 200'000'000ull;
  s = c.register_rank(liar);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.str();
  EXPECT_NE(s.message().find("nothing accepts connects at " + first.endpoint()), std::string::npos) << s.str();
  EXPECT_EQ(c.lookup(1, 0, 0)->control_endpoint, second.endpoint());
}

// One HTTP PUT /route of `info` to 127.0.0.1:`port` from the source address `from` (another
// loopback address plays another host); the reply's status code (0: no reply).
int put_from(const std::string& from, uint16_t port, const PrefillRankInfo& info) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, from.c_str(), &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int status = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) == 0 &&
      ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) == 0) {
    const std::string body = bootstrap::rank_info_to_json(info).dump();
    const std::string req = "PUT /route HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                            "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[64] = {};
      if (::recv(fd, buf, sizeof buf - 1, MSG_WAITALL) > 12) status = std::atoi(buf + 9);  // "HTTP/1.1 200"
    }
  }
  ::close(fd);
  return status;
}

// Issue 31 (the attack on the probes of attack 2b's fix): the service probed any endpoint a PUT
// named, so it scanned ports for anyone (48 ports in 5 s) and a peer anywhere could exhaust its
// probe budget or stamp a rank's entry. Now an entry a rank PUT from its own host (the endpoint's
// host is the request's source address) is replaced only by a PUT from that host; only such
// endpoints are probed; and one source address holds at most 1024 entries, so filling the table
// from one host locks no other host's ranks out.
TEST_F(Bootstrap, AnEntryFromItsOwnHostIsReplacedOnlyFromThatHost) {
  BootstrapClient c(address_, 2000);
  Listener live;
  PrefillRankInfo real = rank(0, live.endpoint());
  real.incarnation = static_cast<uint64_t>(realtime_ns());
  ASSERT_TRUE(c.register_rank(real).ok());  // from 127.0.0.1, naming 127.0.0.1: its own host
  Listener liars;  // a listener of the peer's own, on this host
  PrefillRankInfo copy = real;
  copy.incarnation = real.incarnation + 59'000'000'000ull;
  copy.control_endpoint = liars.endpoint();
  EXPECT_EQ(put_from("127.0.0.2", server_->port(), copy), 400);  // from another host, naming this one's
  EXPECT_EQ(c.lookup(1, 0, 0)->control_endpoint, live.endpoint());
  EXPECT_EQ(c.lookup(1, 0, 0)->incarnation, real.incarnation);
  // An entry a peer elsewhere PUT is replaced by the rank's own PUT, older or not.
  PrefillRankInfo other = rank(1, "tcp://127.0.0.1:7");
  other.incarnation = real.incarnation + 59'000'000'000ull;
  EXPECT_EQ(put_from("127.0.0.2", server_->port(), other), 200);
  Listener live1;
  PrefillRankInfo rank1 = rank(1, live1.endpoint());
  rank1.incarnation = real.incarnation;
  ASSERT_TRUE(c.register_rank(rank1).ok());
  EXPECT_EQ(c.lookup(1, 0, 1)->control_endpoint, live1.endpoint());
  // One source fills at most 1024 entries; others still register.
  int refused = 0;
  for (uint32_t e = 100; e < 100 + 1030; ++e) {
    PrefillRankInfo f = rank(0, "tcp://127.0.0.3:1");
    f.engine_id = e;
    refused += put_from("127.0.0.3", server_->port(), f) == 400;
  }
  EXPECT_EQ(refused, 6);
  PrefillRankInfo next = rank(0, live.endpoint());
  next.engine_id = 7;
  EXPECT_TRUE(c.register_rank(next).ok());
}

TEST(BootstrapClientErrors, UnreachableAndBadAddress) {
  uint16_t port = 0;
  {
    auto s = BootstrapServer::start("127.0.0.1", 0);
    ASSERT_TRUE(s.ok());
    port = (*s)->port();
  }  // stopped: nothing listens on `port` now
  BootstrapClient c("127.0.0.1:" + std::to_string(port), 500);
  const auto t0 = std::chrono::steady_clock::now();
  auto h = c.health();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), ErrorCode::kPeerUnreachable) << h.status().str();

  BootstrapClient bad("no-port-here");
  EXPECT_EQ(bad.lookup(0, 0, 0).status().code(), ErrorCode::kInvalidArgument);
}

TEST(BootstrapServerErrors, PortInUse) {
  auto a = BootstrapServer::start("127.0.0.1", 0);
  ASSERT_TRUE(a.ok());
  auto b = BootstrapServer::start("127.0.0.1", (*a)->port());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), ErrorCode::kInternal);
}

// Raw HTTP: bad payloads get 400 {"error": ...} naming the problem, and the server keeps serving.
TEST_F(Bootstrap, RawBadPayloadsGet400) {
  httplib::Client http("127.0.0.1", server_->port());
  http.set_read_timeout(std::chrono::seconds(2));
  const nlohmann::json good = bootstrap::rank_info_to_json(rank(0, "tcp://127.0.0.1:5600"));

  auto expect_400 = [&](const httplib::Result& res, const std::string& mentions) {
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 400) << res->body;
    auto j = nlohmann::json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << res->body;
    ASSERT_TRUE(j.contains("error")) << res->body;
    EXPECT_NE(j["error"].get<std::string>().find(mentions), std::string::npos) << res->body;
  };

  expect_400(http.Put("/route", "{not json", "application/json"), "invalid JSON");
  expect_400(http.Put("/route", "", "application/json"), "invalid JSON");
  expect_400(http.Put("/route", "[1,2]", "application/json"), "object");
  nlohmann::json missing = good;
  missing.erase("control_endpoint");
  expect_400(http.Put("/route", missing.dump(), "application/json"), "control_endpoint");
  nlohmann::json wrong = good;
  wrong["tp_rank"] = "zero";
  expect_400(http.Put("/route", wrong.dump(), "application/json"), "tp_rank");
  wrong = good;
  wrong["page_size"] = -16;
  expect_400(http.Put("/route", wrong.dump(), "application/json"), "page_size");
  wrong = good;
  wrong["num_layers"] = 1.5;
  expect_400(http.Put("/route", wrong.dump(), "application/json"), "num_layers");
  wrong = good;
  wrong["engine_id"] = 1ull << 32;
  expect_400(http.Put("/route", wrong.dump(), "application/json"), "engine_id");
  wrong = good;
  wrong["host"] = 7;
  expect_400(http.Put("/route", wrong.dump(), "application/json"), "host");
  wrong = good;
  wrong["transport_address"] = "not base64!";
  expect_400(http.Put("/route", wrong.dump(), "application/json"), "transport_address");
  wrong = good;
  wrong["transport_address"] = 12;
  expect_400(http.Put("/route", wrong.dump(), "application/json"), "transport_address");
  wrong = good;
  wrong["transport_address"] = std::string(90000, 'A');  // decodes to more than a worker address may be
  expect_400(http.Put("/route", wrong.dump(), "application/json"), "transport_address");

  expect_400(http.Get("/route?engine_id=abc&dp_rank=0"), "engine_id");
  expect_400(http.Get("/route?engine_id=1&dp_rank=0&tp_rank=1x"), "tp_rank");
  expect_400(http.Get("/route?engine_id=1&dp_rank=-1"), "dp_rank");
  expect_400(http.Get("/route?engine_id=1&dp_rank=99999999999"), "dp_rank");
  expect_400(http.Get("/route?engine_id=1"), "dp_rank");

  // An oversized body is refused without being stored.
  auto big = http.Put("/route", std::string(2 * 1024 * 1024, ' '), "application/json");  // over the 1 MiB bound
  ASSERT_TRUE(big) << httplib::to_string(big.error());
  EXPECT_EQ(big->status, 413);

  EXPECT_EQ(server_->registered(), 0u);
  // Still serving: a good registration works.
  auto ok = http.Put("/route", good.dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(nlohmann::json::parse(ok->body), (nlohmann::json{{"ok", true}}));
  auto health = http.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(nlohmann::json::parse(health->body)["ranks"], 1);
  auto none = http.Get("/route?engine_id=1&dp_rank=0&tp_rank=1");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 404);
}

TEST_F(Bootstrap, TransportAddressIsOptional) {
  // A registration without one (an older kvferry) is taken; the lookup gives it empty.
  httplib::Client http("127.0.0.1", server_->port());
  nlohmann::json without = bootstrap::rank_info_to_json(rank(0, "tcp://127.0.0.1:5600"));
  ASSERT_TRUE(without.contains("transport_address"));
  without.erase("transport_address");
  auto put = http.Put("/route", without.dump(), "application/json");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 200) << put->body;
  auto back = BootstrapClient(address_).lookup(1, 0, 0);
  ASSERT_TRUE(back.ok()) << back.status().str();
  EXPECT_EQ(back->transport_address, "");
}

// --- Addresses (kvferry/net.h): IPv6 loopback, host names, a wildcard advertising a given host. ---

// Registers one rank through `client_address` and reads it back.
void expect_round_trip(const std::string& client_address, const PrefillRankInfo& info) {
  BootstrapClient c(client_address, 2000);
  ASSERT_TRUE(c.register_rank(info).ok()) << client_address;
  auto back = c.lookup(info.engine_id, info.dp_rank, info.tp_rank);
  ASSERT_TRUE(back.ok()) << client_address << ": " << back.status().str();
  expect_same(*back, info);
}

PrefillRankInfo rank_at(const std::string& host, uint16_t port) {
  PrefillRankInfo r = rank(0, zmq_endpoint(host, port));
  r.host = host;
  return r;
}

TEST(BootstrapAddresses, Ipv6Loopback) {
  auto s = BootstrapServer::start("[::1]", 0);
  ASSERT_TRUE(s.ok()) << s.status().str();
  const uint16_t port = (*s)->port();
  EXPECT_EQ((*s)->address(), "[::1]:" + std::to_string(port));
  PrefillRankInfo info = rank_at("::1", 5600);
  EXPECT_EQ(info.control_endpoint, "tcp://[::1]:5600");
  expect_round_trip((*s)->address(), info);
  expect_round_trip("http://[::1]:" + std::to_string(port), info);
  EXPECT_EQ((*s)->registered(), 1u);
  // Not listening on IPv4.
  BootstrapClient v4("127.0.0.1:" + std::to_string(port), 300);
  EXPECT_EQ(v4.health().status().code(), ErrorCode::kPeerUnreachable);
}

TEST(BootstrapAddresses, HostName) {
  ListenAddress a;
  a.bind_host = "localhost";
  auto s = BootstrapServer::start(a);
  ASSERT_TRUE(s.ok()) << s.status().str();
  EXPECT_EQ((*s)->address(), "localhost:" + std::to_string((*s)->port()));
  expect_round_trip((*s)->address(), rank_at("localhost", 5601));
  BootstrapClient c((*s)->address());
  EXPECT_EQ(c.lookup(1, 0, 0).value().control_endpoint, "tcp://localhost:5601");
}

TEST(BootstrapAddresses, WildcardAdvertisesGivenHost) {
  ListenAddress a;
  a.bind_host = "::";
  a.advertise_host = "::1";
  auto s = BootstrapServer::start(a);
  ASSERT_TRUE(s.ok()) << s.status().str();
  const std::string port = std::to_string((*s)->port());
  EXPECT_EQ((*s)->address(), "[::1]:" + port);
  // Every interface, IPv4 and IPv6, by address and by name.
  for (const std::string& via : {"[::1]:" + port, "127.0.0.1:" + port, "localhost:" + port}) {
    BootstrapClient c(via, 2000);
    auto h = c.health();
    ASSERT_TRUE(h.ok()) << via << ": " << h.status().str();
  }
  ListenAddress v4;
  v4.bind_host = "0.0.0.0";
  v4.advertise_host = "localhost";
  auto s4 = BootstrapServer::start(v4);
  ASSERT_TRUE(s4.ok()) << s4.status().str();
  EXPECT_EQ((*s4)->address(), "localhost:" + std::to_string((*s4)->port()));
  expect_round_trip("127.0.0.1:" + std::to_string((*s4)->port()), rank_at("10.0.0.5", 5602));
  auto star = BootstrapServer::start("*", 0);
  ASSERT_TRUE(star.ok()) << star.status().str();
  EXPECT_TRUE(BootstrapClient("127.0.0.1:" + std::to_string((*star)->port())).health().ok());
  EXPECT_EQ((*star)->address(), host_port(ListenAddress{"*", "", 0}.advertised(), (*star)->port()));
}

TEST(BootstrapAddresses, BadHosts) {
  for (const char* host : {"bad host", "[10.0.0.1]", "::g"}) {
    auto s = BootstrapServer::start(host, 0);
    ASSERT_FALSE(s.ok()) << host;
    EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument) << s.status().str();
  }
  ListenAddress wild_adv;
  wild_adv.advertise_host = "0.0.0.0";
  EXPECT_EQ(BootstrapServer::start(wild_adv).status().code(), ErrorCode::kInvalidArgument);
  auto not_local = BootstrapServer::start("192.0.2.1", 0);  // TEST-NET-1: no interface has it
  ASSERT_FALSE(not_local.ok());
  EXPECT_EQ(not_local.status().code(), ErrorCode::kInternal) << not_local.status().str();
  for (const char* address : {"::1:8998", "localhost:0", "0.0.0.0:8998", "[::]:8998", "host:port", "a b:1"}) {
    BootstrapClient c(address, 100);
    auto h = c.health();
    ASSERT_FALSE(h.ok()) << address;
    EXPECT_EQ(h.status().code(), ErrorCode::kInvalidArgument) << address << ": " << h.status().str();
  }
}

// A registration must carry a host and control endpoint peers can use.
TEST_F(Bootstrap, RejectsUnusableAddresses) {
  BootstrapClient c(address_);
  struct Case {
    std::string host, endpoint, field;
  };
  for (const Case& k : {Case{"0.0.0.0", "tcp://10.0.0.1:5600", "host"}, Case{"", "tcp://10.0.0.1:5600", "host"},
                        Case{"bad host", "tcp://10.0.0.1:5600", "host"},
                        Case{"10.0.0.1", "tcp://0.0.0.0:5600", "control_endpoint"},
                        Case{"10.0.0.1", "tcp://[::]:5600", "control_endpoint"},
                        Case{"10.0.0.1", "tcp://10.0.0.1:0", "control_endpoint"},
                        Case{"10.0.0.1", "tcp://::1:5600", "control_endpoint"},
                        Case{"10.0.0.1", "ipc:///tmp/x", "control_endpoint"},
                        Case{"10.0.0.1", "10.0.0.1:5600", "control_endpoint"}}) {
    PrefillRankInfo bad = rank(0, k.endpoint);
    bad.host = k.host;
    Status s = c.register_rank(bad);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << k.host << " " << k.endpoint << ": " << s.str();
    EXPECT_NE(s.message().find("'" + k.field + "'"), std::string::npos) << s.str();
  }
  EXPECT_EQ(server_->registered(), 0u);
  PrefillRankInfo named = rank(0, "tcp://decode-0.example:5600");
  named.host = "decode-0.example";
  EXPECT_TRUE(c.register_rank(named).ok());  // a host name need not resolve at the bootstrap
}

}  // namespace
}  // namespace kvferry
