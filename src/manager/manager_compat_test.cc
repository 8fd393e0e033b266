// The compatibility handshake (issue 34 item 4; kvferry/compat.h): a prefill and a decode manager
// whose fingerprints differ refuse each other before using anything else the other sent, with one
// error line on each side naming the field and both values, and rooms between them fail with
// incompatible_peer. Real managers, real sockets, one process (manager_pair_test_util.h).
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "kvferry/control.h"
#include "kvferry/log.h"
#include "kvferry/messages.h"
#include "manager/manager_pair_test_util.h"

namespace kvferry::testing {
namespace {

struct Line {
  LogLevel level;
  std::string component, msg;
};

// Collects every line of event "incompatible_peer" until destroyed.
struct IncompatibleLines {
  std::mutex mu;
  std::vector<Line> lines;
  IncompatibleLines() {
    set_log_callback([this](LogLevel level, std::string_view component, std::string_view msg, const LogFields& f) {
      for (const auto& [k, v] : f.extra)
        if (k == "event" && v == "incompatible_peer") {
          std::lock_guard lock(mu);
          lines.push_back({level, std::string(component), std::string(msg)});
        }
    });
  }
  ~IncompatibleLines() { set_log_callback({}); }
  std::vector<Line> of(std::string_view component_prefix) {
    std::lock_guard lock(mu);
    std::vector<Line> out;
    for (const Line& l : lines)
      if (l.component.rfind(component_prefix, 0) == 0) out.push_back(l);
    return out;
  }
};

struct Prefill {
  std::unique_ptr<BootstrapServer> server;
  std::string bootstrap;
  std::unique_ptr<Manager> m;
};

// A prefill manager with its own progress thread registered at its own bootstrap service.
Prefill start_prefill() {
  Prefill p;
  auto server = BootstrapServer::start("127.0.0.1", 0);
  EXPECT_TRUE(server.ok());
  if (!server.ok()) return p;
  p.server = std::move(server).value();
  p.bootstrap = "127.0.0.1:" + std::to_string(p.server->port());
  ManagerConfig c = base_config(Role::kPrefill, "tcp", /*thread=*/true);
  c.bootstrap_address = p.bootstrap;
  c.deadlines = notice_only();
  auto m = Manager::create(c);
  EXPECT_TRUE(m.ok()) << m.status().str();
  if (m.ok()) p.m = std::move(m).value();
  return p;
}

uint64_t refused(const Manager& m, const std::string& kind) {
  for (const auto& [k, n] : m.stats().refusals)
    if (k == kind) return n;
  return 0;
}

bool eventually(const std::function<bool()>& pred) {
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    wait_readable(nullptr, 0, 5);
  }
  return true;
}

TEST(ManagerCompat, APageSizeMismatchIsRefusedOnBothSidesOnceNamingTheFieldAndBothValues) {
  IncompatibleLines lines;
  Prefill p = start_prefill();
  ASSERT_TRUE(p.m);
  ManagerConfig dc = base_config(Role::kDecode, "tcp", /*thread=*/true);
  dc.page_size = 32;  // prefill pages hold 16 tokens
  dc.deadlines = notice_only();
  auto d = Manager::create(dc);
  ASSERT_TRUE(d.ok()) << d.status().str();
  // A sender prefill opened before the refusal and has not init()ed (SGLang's order): it must not
  // wait for its bootstrap deadline (an hour here).
  auto early = p.m->sender(6);
  ASSERT_TRUE(early.ok());
  EXPECT_EQ((*early)->poll(), KVPoll::Bootstrapping);
  // Each room's receiver names the prefill instance (SGLang's decode does): refused each time.
  for (uint64_t room : {7u, 8u}) {
    auto rx = (*d)->receiver(room, p.bootstrap);
    ASSERT_FALSE(rx.ok());
    EXPECT_EQ(rx.status().code(), ErrorCode::kIncompatiblePeer) << rx.status().str();
    EXPECT_NE(rx.status().message().find("page_size: ours 32, theirs 16"), std::string::npos) << rx.status().str();
  }
  // The prefill rank refused the registration decode sent it, before its transport saw a key.
  ASSERT_TRUE(eventually([&] { return refused(*p.m, "incompatible") >= 1; }));
  EXPECT_EQ(p.m->stats().peers, 0u);
  ASSERT_TRUE(eventually([&] { return lines.of("prefill").size() >= 1; }));
  const std::vector<Line> pl = lines.of("prefill");
  const std::vector<Line> dl = lines.of("decode");
  ASSERT_EQ(pl.size(), 1u);
  ASSERT_EQ(dl.size(), 1u);  // once per source incarnation, not once per receiver
  EXPECT_EQ(pl[0].level, LogLevel::kError);
  EXPECT_EQ(dl[0].level, LogLevel::kError);
  EXPECT_NE(pl[0].msg.find("page_size: ours 16, theirs 32"), std::string::npos) << pl[0].msg;
  EXPECT_NE(dl[0].msg.find("page_size: ours 32, theirs 16"), std::string::npos) << dl[0].msg;
  ASSERT_TRUE(eventually([&] { return (*early)->poll() == KVPoll::Failed; }));
  EXPECT_EQ((*early)->failure()->code, ErrorCode::kIncompatiblePeer);
  // A room prefill opens for that decode rank fails at once with the refusal's record.
  auto tx = p.m->sender(7);
  ASSERT_TRUE(tx.ok());
  ASSERT_EQ((*tx)->poll(), KVPoll::Failed);
  ASSERT_TRUE((*tx)->failure().has_value());
  EXPECT_EQ((*tx)->failure()->code, ErrorCode::kIncompatiblePeer);
  EXPECT_EQ(refused(*p.m, "incompatible"), 1u);
}

TEST(ManagerCompat, ADecodeManagerConfiguredForAnIncompatibleInstanceDoesNotStart) {
  IncompatibleLines lines;
  Prefill p = start_prefill();
  ASSERT_TRUE(p.m);
  ManagerConfig dc = base_config(Role::kDecode, "tcp", /*thread=*/true);
  dc.bootstrap_address = p.bootstrap;
  dc.tp_size = 2;  // the prefill instance expects a decode engine of TP 1
  dc.peer_tp_size = 1;
  auto d = Manager::create(dc);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kIncompatiblePeer);
  EXPECT_NE(d.status().message().find("tp: ours prefill 1 decode 2, theirs prefill 1 decode 1"), std::string::npos)
      << d.status().str();
  ASSERT_TRUE(eventually([&] { return lines.of("prefill").size() >= 1; }));
  EXPECT_NE(lines.of("prefill")[0].msg.find("tp: ours prefill 1 decode 1, theirs prefill 1 decode 2"),
            std::string::npos);
}

// A peer without the fingerprint (or lying about it) speaking our wire: its frame is refused on
// the fingerprint, so the memory keys it carries never reach the transport's parser (garbage keys
// would otherwise be refused as a bad registration, protocol_error).
TEST(ManagerCompat, ARegistrationWithoutTheFingerprintIsRefusedBeforeItsKeysAreParsed) {
  Prefill p = start_prefill();
  ASSERT_TRUE(p.m);
  BootstrapClient client(p.bootstrap);
  auto entry = client.lookup(0, 0, 0);
  ASSERT_TRUE(entry.ok()) << entry.status().str();
  EXPECT_FALSE(entry->compat.empty());
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok());
  // A RegistrationRefusal goes once to an endpoint not known here (prefill_registration.cc
  // may_answer): the first frame's comes back; the second is counted.
  for (bool with_compat : {false, true}) {
    PoolRegistration reg;
    reg.sender = {Role::kDecode, 0, 0, 0};
    if (with_compat) {
      reg.compat = entry->compat;
      for (CompatField& f : reg.compat)
        if (f.name == "dtype_bytes") f.value = "4";
    }
    reg.incarnation = 1000 + (with_compat ? 1 : 0);
    reg.control_endpoint = (*sock)->endpoint();
    reg.worker_address = std::string(64, '\x5a');
    reg.spans = {{0, 1ull << 20, 0x1000, std::string(200, '\xff')}};  // no key UCX could unpack
    reg.page_size = 16;
    reg.page_bytes = 4096;
    reg.num_pages = 16;
    reg.kv_offsets = {0};
    reg.aux_rows = 1;
    reg.heads_per_rank = 1;
    const uint64_t before = refused(*p.m, "incompatible");
    ASSERT_TRUE((*sock)->send(entry->control_endpoint, encode(Message{reg})).ok());
    ASSERT_TRUE(eventually([&] { return refused(*p.m, "incompatible") == before + 1; }));
    if (with_compat) continue;
    std::optional<RegistrationRefusal> refusal;
    const auto end = std::chrono::steady_clock::now() + 20s;
    while (!refusal && std::chrono::steady_clock::now() < end) {
      auto frame = (*sock)->recv(std::chrono::milliseconds(50));
      if (!frame) continue;
      auto msg = decode(*frame);
      if (msg.ok() && std::holds_alternative<RegistrationRefusal>(*msg)) refusal = std::get<RegistrationRefusal>(*msg);
    }
    ASSERT_TRUE(refusal.has_value()) << "no refusal came back";
    EXPECT_EQ(refusal->failure.code, ErrorCode::kIncompatiblePeer) << refusal->failure.reason;
    EXPECT_NE(refusal->failure.reason.find("version: ours 0.1.0"), std::string::npos) << refusal->failure.reason;
  }
  EXPECT_EQ(refused(*p.m, "incompatible"), 2u);
  EXPECT_EQ(refused(*p.m, "bad_registration"), 0u);
  EXPECT_EQ(p.m->stats().peers, 0u);
}

// Anyone who reaches prefill's port may send a registration in a live decode rank's name: one
// whose fingerprint differs must not cut that rank off (no refusal record, no failed rooms).
TEST(ManagerCompat, AMismatchedRegistrationInALiveDecodeRanksNameChangesNothing) {
  auto r = make_ranks("tcp", /*thread=*/false, notice_only());
  ASSERT_TRUE(r);
  EXPECT_EQ(refused(*r->prefill, "incompatible"), 0u);
  BootstrapClient client(r->bootstrap);
  auto entry = client.lookup(0, 0, 0);
  ASSERT_TRUE(entry.ok()) << entry.status().str();
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(sock.ok());
  PoolRegistration forged;
  forged.sender = {Role::kDecode, 0, 0, 0};  // the live decode rank
  forged.compat = entry->compat;
  for (CompatField& f : forged.compat)
    if (f.name == "page_size") f.value = "64";
  forged.incarnation = 4242;
  forged.control_endpoint = (*sock)->endpoint();
  forged.worker_address = "x";
  forged.spans = {{0, 1ull << 20, 0x1000, std::string(8, '\xff')}};
  forged.page_size = 64;
  forged.page_bytes = 4096;
  forged.num_pages = 16;
  forged.kv_offsets = {0};
  forged.aux_rows = 1;
  forged.heads_per_rank = 1;
  ASSERT_TRUE((*sock)->send(entry->control_endpoint, encode(Message{forged})).ok());
  ASSERT_TRUE(r->until([&] { return refused(*r->prefill, "incompatible") == 1; }));
  EXPECT_EQ(r->prefill->stats().peers, 1u);
  // A room between the live pair still moves.
  const std::vector<uint64_t> pages = {1, 2};
  AskedRoom a = asked_room(*r, 11, pages, 0);
  ASSERT_TRUE(a.tx) << "the room never got to WaitingForInput";
  ASSERT_TRUE(a.tx->init(pages.size(), 0).ok());
  fill(*r->prefill, 11, 0, {3, 4});
  const std::vector<uint64_t> src = {3, 4};
  ASSERT_TRUE(a.tx->send(src, {}, true).ok());
  ASSERT_TRUE(r->until([&] { return a.rx->poll() == KVPoll::Success; }));
  EXPECT_EQ(mismatched(*r->decode, 11, pages), 0u);
}

}  // namespace
}  // namespace kvferry::testing
