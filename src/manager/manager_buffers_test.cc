// The public Manager over engine-owned buffers (kvferry/buffers.h): one KV buffer per layer
// tensor, two aux buffers and one state buffer on each side, a room moved in two chunks with an
// empty last chunk carrying the state rows; every KV byte, both aux rows and the state row arrive.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/bootstrap.h"
#include "kvferry/manager.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kPages = 8, kAuxRows = 8, kStateRows = 4;
constexpr uint64_t kAuxItem[2] = {16, 8};
constexpr uint64_t kStateItem = 96;

// One rank's engine memory, with every byte set from (side, buffer, offset).
struct EngineMemory {
  std::vector<std::vector<uint8_t>> kv, aux, state;
  std::vector<BufferDesc> descs;

  EngineMemory(uint64_t page_bytes, uint32_t kv_buffers, uint8_t seed) {
    auto add = [&](std::vector<std::vector<uint8_t>>& into, uint64_t bytes, uint64_t item, BufferKind kind) {
      into.emplace_back(bytes);
      std::vector<uint8_t>& b = into.back();
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(seed + i * 7 + into.size() * 13);
      descs.push_back({reinterpret_cast<uint64_t>(b.data()), bytes, item, kind, MemoryKind::kHost});
    };
    kv.reserve(kv_buffers);
    for (uint32_t i = 0; i < kv_buffers; ++i) add(kv, kPages * page_bytes, page_bytes, BufferKind::kKv);
    aux.reserve(2);
    for (uint64_t item : kAuxItem) add(aux, kAuxRows * item, item, BufferKind::kAux);
    add(state, kStateRows * kStateItem, kStateItem, BufferKind::kState);
  }
};

// A prefill and a decode manager over engine memory of their own, behind a bootstrap service.
struct BufferRanks {
  std::unique_ptr<BootstrapServer> server;
  std::unique_ptr<EngineMemory> pm, dm;
  std::unique_ptr<Manager> prefill, decode;
  uint64_t page_bytes = 0;
  uint32_t kv_buffers = 0;
};
std::unique_ptr<BufferRanks> make_buffer_ranks(bool fault_injection, bool progress_thread) {
  auto r = std::make_unique<BufferRanks>();
  auto server = BootstrapServer::start("127.0.0.1", 0);
  auto pc = testing::test_manager_config({Role::kPrefill, 0, 0, 0});
  auto dc = testing::test_manager_config({Role::kDecode, 0, 0, 0});
  auto probe = testing::make_test_layout();
  if (!server.ok() || !pc.ok() || !dc.ok() || !probe.ok()) return nullptr;
  r->server = std::move(server).value();
  const std::string bootstrap = "127.0.0.1:" + std::to_string(r->server->port());
  r->page_bytes = probe->page_bytes();
  r->kv_buffers = probe->num_buffers();
  r->pm = std::make_unique<EngineMemory>(r->page_bytes, r->kv_buffers, 1);
  r->dm = std::make_unique<EngineMemory>(r->page_bytes, r->kv_buffers, 100);
  pc->buffers = r->pm->descs;
  dc->buffers = r->dm->descs;
  for (ManagerConfig* c : {&*pc, &*dc}) {
    c->bootstrap_address = bootstrap;
    c->progress_thread = progress_thread;
  }
  pc->fault_injection = fault_injection;
  auto p = Manager::create(*pc);
  auto d = Manager::create(*dc);
  EXPECT_TRUE(p.ok() && d.ok()) << p.status().str() << " / " << d.status().str();
  if (!p.ok() || !d.ok()) return nullptr;
  r->prefill = std::move(p).value();
  r->decode = std::move(d).value();
  return r;
}

// Polls pred (the managers run their own progress threads) until it holds or 20 s passed.
bool until(const std::function<bool()>& pred) {
  for (auto end = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < end;) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

TEST(ManagerBuffers, RoomMovesKvAuxAndStateRowsOfEngineBuffers) {
  auto ranks = make_buffer_ranks(false, false);
  ASSERT_TRUE(ranks);
  Manager& prefill = *ranks->prefill;
  Manager& decode = *ranks->decode;
  EngineMemory& pm = *ranks->pm;
  EngineMemory& dm = *ranks->dm;
  EXPECT_EQ(prefill.layout().num_pages, kPages);
  EXPECT_EQ(decode.layout().aux_slots, kAuxRows);
  EXPECT_EQ(prefill.pool_base(), nullptr);
  auto until = [&](const std::function<bool()>& pred) {
    for (auto end = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < end;) {
      prefill.progress();
      decode.progress();
      if (pred()) return true;
      std::vector<int> fds = prefill.wait_fds();
      for (int fd : decode.wait_fds()) fds.push_back(fd);
      wait_readable(fds.data(), static_cast<int>(fds.size()), 1);
    }
    return false;
  };
  ASSERT_TRUE(until([&] { return prefill.stats().peers == 1; }));

  const uint64_t room = 4242;
  const std::vector<uint64_t> src{5, 0, 3}, dst{1, 7, 2}, pstate{3}, dstate{0};
  const uint64_t paux = 2, daux = 6;
  auto rx = decode.receiver(room).value();
  auto tx = prefill.sender(room).value();
  ASSERT_TRUE(rx->init().ok());
  ASSERT_TRUE(rx->send_metadata(dst, daux, dstate).ok());
  ASSERT_TRUE(tx->init(3, paux).ok());
  ASSERT_TRUE(until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  ASSERT_TRUE(tx->send(std::span(src).first(2), {}, false).ok());
  ASSERT_TRUE(tx->send(std::span(src).subspan(2), {}, false).ok());
  ASSERT_TRUE(tx->send({}, pstate, true).ok());
  ASSERT_TRUE(until([&] { return rx->poll() == KVPoll::Success && tx->poll() == KVPoll::Success; }))
      << "prefill " << to_string(tx->poll()) << ", decode " << to_string(rx->poll());
  EXPECT_TRUE(rx->release_safe());

  const uint64_t pb = ranks->page_bytes;
  uint64_t bad = 0;
  for (size_t b = 0; b < pm.kv.size(); ++b)
    for (size_t i = 0; i < src.size(); ++i)
      bad += std::memcmp(pm.kv[b].data() + src[i] * pb, dm.kv[b].data() + dst[i] * pb, pb) != 0;
  EXPECT_EQ(bad, 0u) << "KV pages that differ";
  for (size_t a = 0; a < 2; ++a)
    EXPECT_EQ(std::memcmp(pm.aux[a].data() + paux * kAuxItem[a], dm.aux[a].data() + daux * kAuxItem[a], kAuxItem[a]), 0)
        << "aux buffer " << a;
  EXPECT_EQ(std::memcmp(pm.state[0].data() + pstate[0] * kStateItem, dm.state[0].data() + dstate[0] * kStateItem,
                        kStateItem), 0);
  // Rows and pages the room does not name are untouched.
  EngineMemory fresh(pb, ranks->kv_buffers, 100);
  EXPECT_EQ(dm.aux[0][0], fresh.aux[0][0]);
  EXPECT_EQ(std::memcmp(dm.kv[0].data() + 4 * pb, fresh.kv[0].data() + 4 * pb, pb), 0);

  // A state row outside the decode's state buffer is refused before anything is sent.
  auto rx2 = decode.receiver(room + 1).value();
  Status s = rx2->send_metadata(std::vector<uint64_t>{0}, 0, std::vector<uint64_t>{kStateRows});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.str();
  EXPECT_EQ(rx2->poll(), KVPoll::Bootstrapping);
  tx.reset();
  rx.reset();
  rx2.reset();
  EXPECT_TRUE(until([&] { return prefill.stats().live_rooms == 0 && decode.stats().live_rooms == 0; }));
}

// Sender::take_completed_sends(): the last send's number comes back once its KV writes ended, so
// its pages may be reused at once: decode's copy of them is intact. Its aux and state rows are
// read by the room's final batch (with the last chunk's writes): an engine keeps them until the
// room ends, and then decode's copy of them is intact too. Every write of the room is delayed (300 ms), so
// the number cannot come back before the pages were written.
TEST(ManagerBuffers, TheLastSendEndsWhenItsPagesWereWrittenItsRowsWhenTheRoomEnds) {
  auto ranks = make_buffer_ranks(true, true);
  ASSERT_TRUE(ranks);
  Manager& prefill = *ranks->prefill;
  Manager& decode = *ranks->decode;
  EngineMemory& pm = *ranks->pm;
  EngineMemory& dm = *ranks->dm;
  ASSERT_TRUE(until([&] { return prefill.stats().peers == 1; }));
  const uint64_t room = 77;
  const std::vector<uint64_t> src{1, 2}, dst{3, 4}, pstate{2}, dstate{1};
  const uint64_t paux = 3, daux = 5;
  auto rx = decode.receiver(room).value();
  auto tx = prefill.sender(room).value();
  ASSERT_TRUE(rx->init().ok());
  ASSERT_TRUE(rx->send_metadata(dst, daux, dstate).ok());
  ASSERT_TRUE(until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  ASSERT_TRUE(tx->init(2, paux).ok());
  const std::vector<uint8_t> sent_aux = {pm.aux[0].begin() + paux * kAuxItem[0], pm.aux[0].begin() + (paux + 1) * kAuxItem[0]};
  const std::vector<uint8_t> sent_state = {pm.state[0].begin() + pstate[0] * kStateItem,
                                           pm.state[0].begin() + (pstate[0] + 1) * kStateItem};
  // The pages as sent: every KV buffer's item of source pages 1 and 2.
  auto pages_of = [](EngineMemory& m, const std::vector<uint64_t>& pages) {
    std::vector<uint8_t> out;
    for (auto& buf : m.kv) {
      const uint64_t item = buf.size() / kPages;
      for (uint64_t p : pages) out.insert(out.end(), buf.begin() + p * item, buf.begin() + (p + 1) * item);
    }
    return out;
  };
  const std::vector<uint8_t> sent_pages = pages_of(pm, src);
  prefill.faults()->delay_room(room, 300ms);
  const int64_t sent_ns = monotonic_ns();
  ASSERT_TRUE(tx->send(src, pstate, true).ok());  // send 0: every page, the state row, then aux/guard
  std::vector<uint64_t> back;
  ASSERT_TRUE(until([&] { return !(back = tx->take_completed_sends()).empty(); }));
  EXPECT_EQ(back, std::vector<uint64_t>{0});
  EXPECT_GE(monotonic_ns() - sent_ns, 300'000'000) << "the number came back before the delayed writes ended";
  // The engine reuses the send's pages at once; it keeps the rows until the room ends.
  for (auto& buf : pm.kv)
    for (uint64_t p : src) std::memset(buf.data() + p * (buf.size() / kPages), 0xEE, buf.size() / kPages);
  ASSERT_TRUE(until([&] { return rx->poll() == KVPoll::Success && tx->poll() == KVPoll::Success; }))
      << to_string(rx->poll());
  EXPECT_EQ(pages_of(dm, dst), sent_pages);
  std::memset(pm.aux[0].data() + paux * kAuxItem[0], 0xEE, kAuxItem[0]);
  std::memset(pm.state[0].data() + pstate[0] * kStateItem, 0xEE, kStateItem);
  EXPECT_EQ(std::memcmp(dm.aux[0].data() + daux * kAuxItem[0], sent_aux.data(), kAuxItem[0]), 0);
  EXPECT_EQ(std::memcmp(dm.state[0].data() + dstate[0] * kStateItem, sent_state.data(), kStateItem), 0);
}

// The last send carries pages and one state row where decode's metadata gave two: its final
// batch cannot be built, so the room fails (protocol_error at prefill) with nothing of that send
// written. The send still ends (its number comes back), the sender becomes release-safe, and
// dropping it releases the room: before, the failed send was counted as in flight for good.
TEST(ManagerBuffers, ALastSendWhoseStateRowsDoNotMatchFailsTheRoomAndEnds) {
  auto ranks = make_buffer_ranks(true, true);
  ASSERT_TRUE(ranks);
  Manager& prefill = *ranks->prefill;
  Manager& decode = *ranks->decode;
  ASSERT_TRUE(until([&] { return prefill.stats().peers == 1; }));
  const uint64_t room = 78;
  auto rx = decode.receiver(room).value();
  auto tx = prefill.sender(room).value();
  ASSERT_TRUE(rx->init().ok());
  const std::vector<uint64_t> dst{3, 4}, dstate{0, 1}, src0{1}, src1{2}, pstate{2};
  ASSERT_TRUE(rx->send_metadata(dst, 5, dstate).ok());
  ASSERT_TRUE(until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  ASSERT_TRUE(tx->init(2, 3).ok());
  ASSERT_TRUE(tx->send(src0, {}, false).ok());     // send 0
  (void)tx->send(src1, pstate, true);              // send 1: one state row for decode's two
  ASSERT_TRUE(until([&] { return tx->poll() == KVPoll::Failed; }));
  auto e = tx->failure();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kProtocolError);
  EXPECT_EQ(e->origin, prefill.self());
  std::vector<uint64_t> back;
  ASSERT_TRUE(until([&] {
    for (uint64_t n : tx->take_completed_sends()) back.push_back(n);
    return back.size() == 2;
  })) << back.size() << " of 2 sends ended";
  ASSERT_TRUE(until([&] { return tx->release_safe() && rx->poll() == KVPoll::Failed && rx->release_safe(); }));
  tx.reset();
  rx.reset();
  EXPECT_TRUE(until([&] { return prefill.stats().live_rooms == 0; })) << prefill.stats().live_rooms << " live rooms";
}

}  // namespace
}  // namespace kvferry
