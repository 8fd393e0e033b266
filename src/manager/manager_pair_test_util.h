// A prefill and a decode Manager in one process (kvferry/manager.h, public API only), caller-pumped
// or with their own progress threads, and the room helpers the manager tests share
// (manager_test.cc, manager_rooms_test.cc).
// Thread contract: the test's thread.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"
#include "endpoint/waker.h"
#include "kvferry/bootstrap.h"
#include "kvferry/content.h"
#include "kvferry/manager.h"

namespace kvferry::testing {

using namespace std::chrono_literals;

struct Ranks {
  std::unique_ptr<BootstrapServer> server;
  std::string bootstrap;
  std::unique_ptr<Manager> prefill, decode;
  bool pumped = true;

  void pump() {
    if (!pumped) return;
    prefill->progress();
    decode->progress();
  }
  // Pumps (caller-pumped) or waits until pred() holds or `timeout` passed.
  bool until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 10s,
             const std::function<void()>& step = {}) {
    auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (step) step();
      else pump();
      if (pred()) return true;
      if (std::chrono::steady_clock::now() > end) return false;
      std::vector<int> fds = decode->wait_fds();
      for (int fd : prefill->wait_fds()) fds.push_back(fd);
      wait_readable(fds.data(), static_cast<int>(fds.size()), 1);
    }
  }
};

// Waits (managers running their own progress threads) until pred() holds or `timeout` passed.
inline bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 30s) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline ManagerConfig base_config(Role role, const std::string& transport, bool thread) {
  ManagerConfig c;
  c.self = {role, 0, 0, 0};
  auto model = load_test_model("Qwen2.5-7B");
  EXPECT_TRUE(model.ok()) << model.status().str();
  if (model.ok()) c.model = *model;
  c.page_size = 16;
  c.pool_bytes = 16ull << 20;
  c.aux_rows = 64;
  c.transport = transport;
  c.progress_thread = thread;
  c.fault_injection = true;
  return c;
}

inline std::unique_ptr<Ranks> make_ranks(const std::string& transport, bool thread, const Deadlines& d = {},
                                         const std::function<void(ManagerConfig&)>& tweak = {}) {
  auto r = std::make_unique<Ranks>();
  auto server = BootstrapServer::start("127.0.0.1", 0);
  EXPECT_TRUE(server.ok());
  if (!server.ok()) return nullptr;
  r->server = std::move(server).value();
  r->bootstrap = "127.0.0.1:" + std::to_string(r->server->port());
  r->pumped = !thread;
  ManagerConfig pc = base_config(Role::kPrefill, transport, thread);
  pc.bootstrap_address = r->bootstrap;
  pc.deadlines = d;
  if (tweak) tweak(pc);
  auto p = Manager::create(pc);
  EXPECT_TRUE(p.ok()) << p.status().str();
  if (!p.ok()) return nullptr;
  r->prefill = std::move(p).value();
  ManagerConfig dc = base_config(Role::kDecode, transport, thread);
  dc.bootstrap_address = r->bootstrap;
  dc.deadlines = d;
  if (tweak) tweak(dc);
  auto m = Manager::create(dc);
  EXPECT_TRUE(m.ok()) << m.status().str();
  if (!m.ok()) return nullptr;
  r->decode = std::move(m).value();
  if (!r->until([&] { return r->prefill->stats().peers == 1; })) {
    ADD_FAILURE() << "the decode pool registration never reached the prefill manager";
    return nullptr;
  }
  return r;
}

// Writes the room's pages [first_page, first_page + pages.size()) into prefill pages `pages`.
inline void fill(Manager& m, uint64_t room, uint64_t first_page, const std::vector<uint64_t>& pages) {
  const PoolLayout& l = m.layout();
  for (size_t i = 0; i < pages.size(); ++i)
    for (uint32_t b = 0; b < l.num_buffers(); ++b)
      fill_page(l, room, b, (first_page + i) * l.page_size, m.pool_base() + l.page_offset(b, pages[i]));
}

inline uint64_t mismatched(Manager& m, uint64_t room, const std::vector<uint64_t>& pages) {
  const PoolLayout& l = m.layout();
  uint64_t bad = 0;
  for (size_t i = 0; i < pages.size(); ++i)
    for (uint32_t b = 0; b < l.num_buffers(); ++b)
      bad += verify_page(l, room, b, i * l.page_size, m.pool_base() + l.page_offset(b, pages[i]));
  return bad;
}

// Deadlines under which only a failure notice can end a room (bootstrap and waiting: 1 h).
inline Deadlines notice_only(int64_t bootstrap_timeout_ms = 3'600'000) {
  Deadlines d;
  d.waiting_timeout_ms = 3'600'000;
  d.bootstrap_timeout_ms = bootstrap_timeout_ms;
  return d;
}

// A room decode asked for: receiver init()ed with its metadata (`pages`) sent, and a sender whose
// poll says WaitingForInput (not init()ed: SGLang's order). Empty handles if it did not get there.
struct AskedRoom {
  std::unique_ptr<Receiver> rx;
  std::unique_ptr<Sender> tx;
};
inline AskedRoom asked_room(Ranks& r, uint64_t room, const std::vector<uint64_t>& pages, uint64_t aux) {
  AskedRoom a{r.decode->receiver(room).value(), r.prefill->sender(room).value()};
  if (!a.rx->init(-1).ok() || !a.rx->send_metadata(pages, aux, {}).ok() ||
      !r.until([&] { return a.tx->poll() == KVPoll::WaitingForInput; }, 20s))
    return {};
  return a;
}

}  // namespace kvferry::testing
