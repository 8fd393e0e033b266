#include "kvferry/fault_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace kvferry {
namespace {

using namespace std::chrono_literals;

// Records what reaches it; completes every write ok at once.
class FakeTransport : public Transport {
 public:
  struct Seen {
    PeerId peer;
    uint64_t room;
    size_t ops;
  };
  Result<LocalRegion> create_region(uint64_t bytes) override {
    LocalRegion r;
    r.bytes = bytes;
    r.packed_rkey = "rkey";
    return r;
  }
  Result<std::vector<LocalRegion>> register_spans(const std::vector<MemorySpan>& spans) override {
    std::vector<LocalRegion> out;
    for (const MemorySpan& s : spans) out.push_back({s.base, s.bytes, s.offset, "rkey"});
    return out;
  }
  TransportCaps caps() const override {
    TransportCaps c;
    c.name = "fake";
    c.memory_kinds = {MemoryKind::kHost};
    return c;
  }
  std::string address() const override { return "fake-address"; }
  Result<PeerId> connect(const RemoteRegionInfo& peer) override {
    return peer.worker_address == "bad" ? Result<PeerId>(ErrorCode::kPeerUnreachable, "bad")
                                        : Result<PeerId>(PeerId{7});
  }
  void disconnect(PeerId peer) override { disconnected = peer; }
  void write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
             std::function<void(Status)> done) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back({peer, room, ops.size()});
    }
    done(Status::Ok());
  }
  void set_peer_error_handler(std::function<void(PeerId, Status)> h) override { handler = h; }
  TransportStats stats() const override {
    TransportStats s;
    s.batches = 5;
    s.failed_batches = 1;
    s.peers = 2;
    return s;
  }

  std::mutex mu;
  std::vector<Seen> seen;
  PeerId disconnected = 0;
  std::function<void(PeerId, Status)> handler;
};

struct Fixture {
  FakeTransport* fake = new FakeTransport;
  FaultInjectingTransport t{std::unique_ptr<Transport>(fake)};

  Status write(uint64_t room) {
    auto p = std::make_shared<std::promise<Status>>();
    auto f = p->get_future();
    t.write(1, room, {{0, 0, 8}}, [p](Status s) { p->set_value(std::move(s)); });
    if (f.wait_for(5s) != std::future_status::ready) return {ErrorCode::kInternal, "timeout"};
    return f.get();
  }
  size_t seen() {
    std::lock_guard<std::mutex> lock(fake->mu);
    return fake->seen.size();
  }
};

TEST(FaultTransportTest, FailsExactlyTheArmedRoomUntilCleared) {
  Fixture f;
  f.t.fail_room(42, ErrorCode::kInjected, "plan: room 42");
  Status st = f.write(42);
  EXPECT_EQ(st.code(), ErrorCode::kInjected);
  EXPECT_EQ(st.message(), "plan: room 42");
  EXPECT_EQ(f.seen(), 0u);  // nothing forwarded
  EXPECT_TRUE(f.write(43).ok());
  ASSERT_EQ(f.seen(), 1u);
  EXPECT_EQ(f.fake->seen[0].room, 43u);
  EXPECT_EQ(f.write(42).code(), ErrorCode::kInjected);  // still armed
  f.t.clear_room(42);
  EXPECT_TRUE(f.write(42).ok());
  EXPECT_EQ(f.seen(), 2u);
  EXPECT_EQ(f.t.injected_failures(), 2u);
  TransportStats s = f.t.stats();
  EXPECT_EQ(s.batches, 5u + 2u);
  EXPECT_EQ(s.failed_batches, 1u + 2u);
  EXPECT_EQ(s.peers, 2u);
}

TEST(FaultTransportTest, RearmingARoomReplacesTheStatus) {
  Fixture f;
  f.t.fail_room(1, ErrorCode::kInjected, "first");
  f.t.fail_room(1, ErrorCode::kTransferError, "second");
  Status st = f.write(1);
  EXPECT_EQ(st.code(), ErrorCode::kTransferError);
  EXPECT_EQ(st.message(), "second");
}

TEST(FaultTransportTest, FailNextWritesCountsDownAcrossRooms) {
  Fixture f;
  f.t.fail_next_writes(2, ErrorCode::kTransferError);
  EXPECT_EQ(f.write(1).code(), ErrorCode::kTransferError);
  EXPECT_EQ(f.write(2).code(), ErrorCode::kTransferError);
  EXPECT_TRUE(f.write(3).ok());
  EXPECT_EQ(f.seen(), 1u);
  EXPECT_EQ(f.t.injected_failures(), 2u);
}

TEST(FaultTransportTest, RoomFaultDoesNotConsumeTheNextWritesCounter) {
  Fixture f;
  f.t.fail_room(9, ErrorCode::kInjected, "room");
  f.t.fail_next_writes(1, ErrorCode::kTransferError);
  EXPECT_EQ(f.write(9).code(), ErrorCode::kInjected);
  EXPECT_EQ(f.write(10).code(), ErrorCode::kTransferError);
  EXPECT_TRUE(f.write(11).ok());
}

TEST(FaultTransportTest, InjectedCompletionRunsOnceAndNeverInsideWrite) {
  Fixture f;
  f.t.fail_room(5, ErrorCode::kInjected, "x");
  std::mutex caller_lock;  // a caller holding a lock its callback needs must not deadlock
  std::atomic<int> calls{0};
  std::promise<std::thread::id> where;
  {
    std::lock_guard<std::mutex> lock(caller_lock);
    f.t.write(1, 5, {}, [&](Status) {
      std::lock_guard<std::mutex> inner(caller_lock);
      if (calls.fetch_add(1) == 0) where.set_value(std::this_thread::get_id());
    });
  }
  auto fut = where.get_future();
  ASSERT_EQ(fut.wait_for(5s), std::future_status::ready);
  EXPECT_NE(fut.get(), std::this_thread::get_id());
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(calls.load(), 1);
}

TEST(FaultTransportTest, ForwardsEverythingElse) {
  Fixture f;
  EXPECT_EQ(f.t.address(), "fake-address");
  EXPECT_EQ(f.t.create_region(123).value().bytes, 123u);
  uint8_t mem[16];
  auto spans = f.t.register_spans({{mem, 16, 4096}});
  ASSERT_TRUE(spans.ok());
  EXPECT_EQ(spans->at(0).offset, 4096u);
  EXPECT_EQ(spans->at(0).base, mem);
  EXPECT_EQ(f.t.caps().name, "fake");
  RemoteRegionInfo info;
  info.worker_address = "ok";
  EXPECT_EQ(f.t.connect(info).value(), 7u);
  info.worker_address = "bad";
  EXPECT_EQ(f.t.connect(info).status().code(), ErrorCode::kPeerUnreachable);
  f.t.disconnect(3);
  EXPECT_EQ(f.fake->disconnected, 3u);
  bool called = false;
  f.t.set_peer_error_handler([&](PeerId, Status) { called = true; });
  ASSERT_TRUE(f.fake->handler);
  f.fake->handler(1, Status(ErrorCode::kPeerUnreachable, "x"));
  EXPECT_TRUE(called);
}

TEST(FaultTransportTest, ConcurrentArmingAndWritingCompletesEveryBatchOnce) {
  Fixture f;
  constexpr int kThreads = 4, kWrites = 500;
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWrites; ++i) {
        uint64_t room = static_cast<uint64_t>(i % 10);
        if (t == 0 && i % 50 == 0) f.t.fail_room(room, ErrorCode::kInjected, "x");
        if (t == 1 && i % 70 == 0) f.t.clear_room(room);
        f.t.write(1, room, {}, [&](Status s) { (s.ok() ? ok : failed)++; });
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 500 && ok + failed < kThreads * kWrites; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(ok + failed, kThreads * kWrites);
  EXPECT_EQ(static_cast<uint64_t>(failed.load()), f.t.injected_failures());
  EXPECT_EQ(static_cast<size_t>(ok.load()), f.seen());
}

// A write's completion, observable without sleeping.
struct Done {
  std::shared_ptr<std::promise<Status>> p = std::make_shared<std::promise<Status>>();
  std::future<Status> f = p->get_future();
  std::function<void(Status)> cb() {
    return [p = p](Status s) { p->set_value(std::move(s)); };
  }
  bool ready() { return f.wait_for(0s) == std::future_status::ready; }
};

TEST(FaultTransportTest, HeldRoomIsForwardedAndCompletedOnlyAfterRelease) {
  Fixture f;
  f.t.hold_room(3);
  Done held1, held2;
  f.t.write(1, 3, {{0, 0, 8}}, held1.cb());
  f.t.write(1, 3, {{0, 0, 8}, {8, 8, 8}}, held2.cb());
  EXPECT_EQ(f.t.queued_writes(3), 2u);
  EXPECT_TRUE(f.write(4).ok());  // other rooms are not held, and complete meanwhile
  ASSERT_EQ(f.seen(), 1u);
  EXPECT_EQ(f.fake->seen[0].room, 4u);
  EXPECT_FALSE(held1.ready());   // room 4 completed after both writes of room 3 were made
  EXPECT_FALSE(held2.ready());
  f.t.release_held(3);
  ASSERT_EQ(held1.f.wait_for(5s), std::future_status::ready);
  ASSERT_EQ(held2.f.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(held1.f.get().ok());
  EXPECT_TRUE(held2.f.get().ok());
  ASSERT_EQ(f.seen(), 3u);
  EXPECT_EQ(f.fake->seen[1].room, 3u);  // in the order written
  EXPECT_EQ(f.fake->seen[1].ops, 1u);
  EXPECT_EQ(f.fake->seen[2].ops, 2u);
  EXPECT_EQ(f.t.queued_writes(3), 0u);
  EXPECT_EQ(f.t.forwarded_late(), 2u);
  EXPECT_TRUE(f.write(3).ok());  // released: completes (at once, or behind the last forward)
}

TEST(FaultTransportTest, DelayedRoomIsForwardedAfterTheDelayInOrder) {
  Fixture f;
  constexpr auto kDelay = 150ms;
  f.t.delay_room(8, kDelay);
  const auto start = std::chrono::steady_clock::now();
  Done first, second;
  f.t.write(1, 8, {{0, 0, 1}}, first.cb());
  f.t.write(1, 8, {{0, 0, 1}, {1, 1, 1}}, second.cb());
  f.t.delay_room(8, 0ms);  // ends the delay: a later write still queues behind the delayed ones
  Done third;
  f.t.write(1, 8, {{0, 0, 1}, {1, 1, 1}, {2, 2, 1}}, third.cb());
  ASSERT_EQ(third.f.wait_for(5s), std::future_status::ready);
  EXPECT_GE(std::chrono::steady_clock::now() - start, kDelay);
  EXPECT_TRUE(first.ready());
  EXPECT_TRUE(second.ready());
  ASSERT_EQ(f.seen(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(f.fake->seen[i].ops, i + 1);  // never overtaken
  EXPECT_EQ(f.t.forwarded_late(), 3u);
  EXPECT_TRUE(f.write(8).ok());
}

TEST(FaultTransportTest, FaultsWinOverHoldsAndDestructionFailsHeldWrites) {
  Done held;
  {
    Fixture f;
    f.t.hold_room(2);
    f.t.fail_room(2, ErrorCode::kInjected, "plan");
    EXPECT_EQ(f.write(2).code(), ErrorCode::kInjected);  // failed at once, not held
    f.t.clear_room(2);
    f.t.write(1, 2, {{0, 0, 8}}, held.cb());
    EXPECT_EQ(f.t.queued_writes(2), 1u);
    EXPECT_FALSE(held.ready());
  }  // never released
  ASSERT_TRUE(held.ready());
  Status st = held.f.get();
  EXPECT_EQ(st.code(), ErrorCode::kTransferError);
  EXPECT_NE(st.message().find("held"), std::string::npos) << st.message();
}

TEST(FaultTransportTest, DestructorRunsPendingInjectedCompletions) {
  std::atomic<int> calls{0};
  {
    Fixture f;
    f.t.fail_next_writes(100, ErrorCode::kInjected);
    for (int i = 0; i < 100; ++i) f.t.write(1, 1, {}, [&](Status) { calls++; });
  }
  EXPECT_EQ(calls.load(), 100);
}

}  // namespace
}  // namespace kvferry
