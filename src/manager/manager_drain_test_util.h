// Test-only helpers for leaving and draining through the public Manager (kvferry/manager.h):
// a log of the lines above debug (LineLog), and a prefill and a decode engine of one rank each over
// a bootstrap service, with rooms asked for and finished (Serving). Header-only; the test thread.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvferry/bootstrap.h"
#include "kvferry/log.h"
#include "kvferry/manager.h"
#include "manager/manager_pair_test_util.h"

namespace kvferry::testing {

struct Line {
  LogLevel level;
  std::string msg;
  LogFields fields;
  std::string event() const {
    for (const auto& [k, v] : fields.extra)
      if (k == "event") return v;
    return {};
  }
};

struct LineLog {
  std::mutex mu;
  std::vector<Line> lines;  // above debug
  LineLog() {
    set_log_callback([this](LogLevel level, std::string_view, std::string_view msg, const LogFields& f) {
      if (level <= LogLevel::kDebug) return;
      std::lock_guard lk(mu);
      lines.push_back({level, std::string(msg), f});
    });
  }
  ~LineLog() { set_log_callback({}); }
  std::vector<Line> snapshot() {
    std::lock_guard lk(mu);
    return lines;
  }
  bool has_event(const std::string& e) {
    for (const Line& l : snapshot())
      if (l.event() == e) return true;
    return false;
  }
};

// Joining and leaving while serving (issue 34 item 2; Manager::leave() and drained(),
// kvferry/manager.h). A prefill engine and a decode engine of one rank each, over a bootstrap
// service; decode names the prefill instance per receiver (no configured instance, so it may be
// forgotten). The idle timeouts are an hour: an instance forgotten within the test's wait is one
// forgotten because its ranks left, not for idleness.
struct Serving {
  std::unique_ptr<BootstrapServer> server;
  std::string bootstrap;
  std::unique_ptr<Manager> prefill, decode;
};

inline std::unique_ptr<Serving> serving() {
  auto s = std::make_unique<Serving>();
  auto server = BootstrapServer::start("127.0.0.1", 0);
  EXPECT_TRUE(server.ok()) << server.status().str();
  if (!server.ok()) return nullptr;
  s->server = std::move(server).value();
  s->bootstrap = "127.0.0.1:" + std::to_string(s->server->port());
  Deadlines d = notice_only();
  d.heartbeat_timeout_ms = 1500;
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    ManagerConfig c = base_config(role, "shm", /*thread=*/true);
    c.deadlines = d;
    c.prefill_instance_idle_ms = 3'600'000;
    c.decode_instance_idle_ms = 3'600'000;
    if (role == Role::kPrefill) c.bootstrap_address = s->bootstrap;
    auto m = Manager::create(c);
    EXPECT_TRUE(m.ok()) << m.status().str();
    if (!m.ok()) return nullptr;
    (role == Role::kPrefill ? s->prefill : s->decode) = std::move(m).value();
  }
  return s;
}

struct InFlight {
  uint64_t room;
  std::vector<uint64_t> src, dst;
  std::unique_ptr<Sender> tx;
  std::unique_ptr<Receiver> rx;
};

// Rooms asked for by decode and waiting for prefill's pages (SGLang's order: sender WaitingForInput).
inline std::vector<InFlight> ask_rooms(Serving& s, uint64_t first, size_t n) {
  std::vector<InFlight> rooms;
  for (size_t i = 0; i < n; ++i) {
    InFlight f{first + i, {2 * i, 2 * i + 1}, {10 + 3 * i, 11 + 3 * i}, nullptr, nullptr};
    auto rx = s.decode->receiver(f.room, s.bootstrap);
    EXPECT_TRUE(rx.ok()) << rx.status().str();
    if (!rx.ok()) return {};
    f.rx = std::move(rx).value();
    f.tx = s.prefill->sender(f.room).value();
    EXPECT_TRUE(f.rx->init(-1).ok());
    EXPECT_TRUE(f.rx->send_metadata(f.dst, i, {}, 32).ok());
    EXPECT_TRUE(f.tx->init(f.src.size(), i, 32).ok());
    rooms.push_back(std::move(f));
  }
  for (InFlight& f : rooms)
    EXPECT_TRUE(wait_until([&] { return f.tx->poll() == KVPoll::WaitingForInput; })) << "room " << f.room;
  return rooms;
}

// Sends every room's pages and waits until both sides concluded each with every byte.
inline void finish(Serving& s, std::vector<InFlight>& rooms) {
  for (InFlight& f : rooms) {
    fill(*s.prefill, f.room, 0, f.src);
    ASSERT_TRUE(f.tx->send(f.src, {}, true).ok());
  }
  for (InFlight& f : rooms) {
    ASSERT_TRUE(wait_until([&] { return f.rx->poll() == KVPoll::Success && f.tx->poll() == KVPoll::Success; }))
        << "room " << f.room;
    EXPECT_EQ(mismatched(*s.decode, f.room, f.dst), 0u) << "room " << f.room;
  }
}

inline void expect_quiet(LineLog& log) {
  for (const Line& l : log.snapshot()) EXPECT_LE(l.level, LogLevel::kInfo) << l.msg;
  EXPECT_TRUE(log.has_event("peer_left"));
}

}  // namespace kvferry::testing
