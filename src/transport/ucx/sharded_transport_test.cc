// Sharded transports (several workers and progress threads sharing one context and region) in one
// process, connected A -> B, over shm and tcp, with equal and different shard counts.
#include "transport/ucx/sharded_transport.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "transport/ucx/shard_address.h"
#include "transport/ucx/transport_test_util.h"

namespace kvferry::ucx {
namespace {

using testing::Completion;
using testing::expected_image;
using testing::write_and_wait;

constexpr uint64_t kRegion = 8ull << 20;
constexpr uint8_t kFill = 0xC3;

struct Shape {
  TransportKind kind;
  uint32_t a_shards;  // the writer
  uint32_t b_shards;  // the receiver
};

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  return std::string(transport_name(info.param.kind)) + "_" + std::to_string(info.param.a_shards) +
         "to" + std::to_string(info.param.b_shards);
}

struct Pair {
  std::unique_ptr<ShardedTransport> a, b;
  LocalRegion ra, rb;
  PeerId peer = 0;
};

Pair make_pair(const Shape& shape, UcxTestHooks hooks_a = {}) {
  Pair p;
  TransportOptions oa, ob;
  oa.kind = ob.kind = shape.kind;
  oa.shards = shape.a_shards;
  ob.shards = shape.b_shards;
  auto a = ShardedTransport::create(oa, hooks_a);
  auto b = ShardedTransport::create(ob);
  EXPECT_TRUE(a.ok()) << a.status().str();
  EXPECT_TRUE(b.ok()) << b.status().str();
  if (!a.ok() || !b.ok()) return p;
  p.a = std::move(a).value();
  p.b = std::move(b).value();
  testing::wire_pair(p, kRegion, kFill);
  return p;
}

class ShardedPairTest : public ::testing::TestWithParam<Shape> {};

// Every room's batches (a 64 KiB run and two small ops each, so tcp uses write and scatter AMs)
// land at their offsets; a room stays on one shard (its callbacks on one thread); rooms spread
// over the shards exactly as shard_of() says.
TEST_P(ShardedPairTest, ManyRoomsLandAtTheReceiverAndStayOnTheirShard) {
  const Shape shape = GetParam();
  Pair p = make_pair(shape);
  ASSERT_NE(p.peer, 0u);
  ASSERT_EQ(p.a->shard_count(), shape.a_shards);
  constexpr int kRooms = 24, kBatchesPerRoom = 3;
  constexpr uint64_t kSlot = 80 << 10;  // remote bytes per batch
  static_assert(kRooms * kBatchesPerRoom * kSlot <= kRegion);
  std::mutex mu;
  std::map<uint64_t, std::set<std::thread::id>> threads;  // room -> callback threads
  std::vector<Completion> done(kRooms * kBatchesPerRoom);
  std::vector<WriteOp> all;
  for (int k = 0; k < kBatchesPerRoom; ++k) {
    for (int r = 0; r < kRooms; ++r) {
      const uint64_t slot = static_cast<uint64_t>(r * kBatchesPerRoom + k);
      const uint64_t remote = slot * kSlot;
      const uint64_t local = (slot * 37 * 4096 + 11) % (kRegion - kSlot);
      std::vector<WriteOp> ops = {{local, remote, 64 << 10},
                                  {local + 70000, remote + (64 << 10), 1000},
                                  {local + 3, remote + (70 << 10), 3000}};
      all.insert(all.end(), ops.begin(), ops.end());
      const uint64_t room = 100 + static_cast<uint64_t>(r);
      auto cb = done[slot].callback();
      p.a->write(p.peer, room, ops, [&mu, &threads, room, cb](Status st) {
        {
          std::lock_guard<std::mutex> lock(mu);
          threads[room].insert(std::this_thread::get_id());
        }
        cb(std::move(st));
      });
    }
  }
  for (auto& c : done) ASSERT_TRUE(c.wait().ok());
  for (auto& c : done) EXPECT_EQ(c.calls->load(), 1);
  std::vector<uint8_t> img = expected_image(kRegion, kFill, all);
  EXPECT_EQ(std::memcmp(p.rb.base, img.data(), kRegion), 0);
  std::set<std::thread::id> used;
  for (auto& [room, ids] : threads) {
    EXPECT_EQ(ids.size(), 1u) << "room " << room << " ran on several threads";
    used.insert(ids.begin(), ids.end());
  }
  EXPECT_EQ(used.size(), shape.a_shards);
  std::vector<uint64_t> per_shard(shape.a_shards, 0);
  for (int r = 0; r < kRooms; ++r) {
    per_shard[ShardedTransport::shard_of(100 + static_cast<uint64_t>(r), shape.a_shards)] +=
        kBatchesPerRoom;
  }
  for (uint32_t i = 0; i < shape.a_shards; ++i) {
    EXPECT_EQ(p.a->shard(i).stats().batches, per_shard[i]) << "shard " << i;
  }
  TransportStats s = p.a->stats();
  EXPECT_EQ(s.batches, static_cast<uint64_t>(kRooms * kBatchesPerRoom));
  EXPECT_EQ(s.bytes_written, static_cast<uint64_t>(kRooms * kBatchesPerRoom) * ((64 << 10) + 4000));
  EXPECT_EQ(s.failed_batches, 0u);
  EXPECT_EQ(s.peers, 1u);
  p.a->disconnect(p.peer);
  EXPECT_EQ(write_and_wait(*p.a, p.peer, 100, {{0, 0, 8}}).code(), ErrorCode::kPeerUnreachable);
  EXPECT_EQ(p.a->stats().peers, 0u);
}

// Out-of-range writes (the sender's own check skipped) reach every receiving shard's worker, and
// each of them refuses them: nothing outside the region, the batch fails.
// (tcp only: shm puts are a copy by the sender, the receiver never sees them.)
class ShardedTcpPairTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ShardedTcpPairTest, EveryReceivingShardChecksIncomingWrites) {
  const Shape shape = GetParam();
  UcxTestHooks forge;
  forge.skip_local_bounds_check = true;
  Pair p = make_pair(shape, forge);
  ASSERT_NE(p.peer, 0u);
  const uint32_t rooms = std::max(shape.a_shards, shape.b_shards);
  for (uint32_t room = 0; room < rooms; ++room) {
    EXPECT_EQ(write_and_wait(*p.a, p.peer, room, {{0, kRegion - 4, 8}}).code(),
              ErrorCode::kProtocolError);
    EXPECT_EQ(write_and_wait(*p.a, p.peer, room, {{0, kRegion - 4, 4}, {8, kRegion, 1}}).code(),
              ErrorCode::kProtocolError);
  }
  // Local shard i writes to the receiver's shard i % b_shards.
  std::vector<uint64_t> expect(shape.b_shards, 0);
  for (uint32_t room = 0; room < rooms; ++room) {
    expect[ShardedTransport::shard_of(room, shape.a_shards) % shape.b_shards] += 2;
  }
  for (uint32_t i = 0; i < shape.b_shards; ++i) {
    EXPECT_EQ(p.b->shard(i).rejected_incoming(), expect[i]) << "receiver shard " << i;
  }
  for (uint64_t i = 0; i < kRegion; ++i) ASSERT_EQ(p.rb.base[i], kFill) << "byte " << i;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ShardedPairTest,
                         ::testing::Values(Shape{TransportKind::kShm, 2, 2},
                                           Shape{TransportKind::kShm, 2, 1},
                                           Shape{TransportKind::kShm, 1, 2},
                                           Shape{TransportKind::kShm, 3, 2},
                                           Shape{TransportKind::kTcp, 2, 2},
                                           Shape{TransportKind::kTcp, 2, 1},
                                           Shape{TransportKind::kTcp, 1, 2},
                                           Shape{TransportKind::kTcp, 3, 2}),
                         shape_name);

INSTANTIATE_TEST_SUITE_P(Shapes, ShardedTcpPairTest,
                         ::testing::Values(Shape{TransportKind::kTcp, 2, 2},
                                           Shape{TransportKind::kTcp, 2, 1},
                                           Shape{TransportKind::kTcp, 1, 3},
                                           Shape{TransportKind::kTcp, 3, 2}),
                         shape_name);

// Caller-owned memory registered by shard 0 and shared by the others: over shm UCX carries such
// puts out through the receiving worker (no shared mapping), here on both receiving shards.
TEST(ShardedTransport, RegisteredCallerMemoryReceivesOnEveryShard) {
  for (TransportKind kind : {TransportKind::kShm, TransportKind::kTcp}) {
    TransportOptions opt;
    opt.kind = kind;
    opt.shards = 2;
    auto a = ShardedTransport::create(opt);
    auto b = ShardedTransport::create(opt);
    ASSERT_TRUE(a.ok() && b.ok());
    constexpr uint64_t kBytes = 1 << 20;
    std::vector<uint8_t> src(kBytes), dst(kBytes + 3, kFill);
    auto sa = a.value()->register_spans({{src.data(), kBytes, 0}});
    auto sb = b.value()->register_spans({{dst.data() + 3, kBytes, 0}});
    ASSERT_TRUE(sa.ok() && sb.ok()) << sa.status().str() << " " << sb.status().str();
    const LocalRegion* ra = &sa->front();
    const LocalRegion* rb = &sb->front();
    testing::fill_pattern(ra->base, kBytes);
    auto id = a.value()->connect(testing::remote_info(*b.value(), *rb));
    ASSERT_TRUE(id.ok()) << id.status().str();
    std::vector<WriteOp> ops0 = {{0, 10, 4096}, {70000, 200000, 300000}};
    std::vector<WriteOp> ops1 = {{5, 600000, 100000}, {kBytes - 8, kBytes - 8, 8}};
    ASSERT_TRUE(write_and_wait(*a.value(), *id, 0, ops0).ok()) << transport_name(kind);
    ASSERT_TRUE(write_and_wait(*a.value(), *id, 1, ops1).ok()) << transport_name(kind);
    EXPECT_EQ(a.value()->shard(0).stats().batches, 1u);
    EXPECT_EQ(a.value()->shard(1).stats().batches, 1u);
    ops0.insert(ops0.end(), ops1.begin(), ops1.end());
    std::vector<uint8_t> img = expected_image(kBytes, kFill, ops0);
    EXPECT_EQ(std::memcmp(dst.data() + 3, img.data(), kBytes), 0) << transport_name(kind);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(dst[i], kFill);
    b.value().reset();  // the transports are gone before the memory they registered
    a.value().reset();
  }
}

TEST(ShardedTransport, ShardCountOutsideTheBoundIsRefused) {
  for (uint32_t n : {0u, kMaxTransportShards + 1}) {
    TransportOptions opt;
    opt.shards = n;
    auto t = make_ucx_transport(opt);
    EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument) << n;
  }
}

TEST(ShardedTransport, OneShardPublishesAPlainWorkerAddress) {
  TransportOptions opt;
  auto one = ShardedTransport::create(opt);
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one.value()->address().starts_with(kShardAddressMagic));
  opt.shards = 3;
  auto three = ShardedTransport::create(opt);
  ASSERT_TRUE(three.ok());
  auto parsed = parse_shard_address(three.value()->address());
  ASSERT_TRUE(parsed.ok()) << parsed.status().str();
  ASSERT_EQ(parsed->size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ((*parsed)[i], three.value()->shard(i).address());
}

TEST(ShardedTransport, MalformedPeerAddressIsRejectedBeforeAnyEndpoint) {
  TransportOptions opt;
  opt.shards = 2;
  auto a = ShardedTransport::create(opt);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a.value()->create_region(1 << 20).ok());
  auto b = ShardedTransport::create(opt);
  ASSERT_TRUE(b.ok());
  auto rb = b.value()->create_region(1 << 20);
  ASSERT_TRUE(rb.ok());
  RemoteRegionInfo info = testing::remote_info(*b.value(), *rb);
  info.worker_address.pop_back();  // the last shard's address is one byte short
  auto r = a.value()->connect(info);
  EXPECT_EQ(r.status().code(), ErrorCode::kProtocolError);
  EXPECT_NE(r.status().message().find("malformed sharded worker address"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(a.value()->stats().peers, 0u);
  EXPECT_EQ(a.value()->shard(0).stats().peers, 0u);
  // The intact address still connects.
  EXPECT_TRUE(a.value()->connect(testing::remote_info(*b.value(), *rb)).ok());
}

TEST(ShardedTransport, EveryShardWritesFromTheOneRegion) {
  TransportOptions opt;
  opt.shards = 2;
  auto a = ShardedTransport::create(opt);
  ASSERT_TRUE(a.ok());
  auto ra = a.value()->create_region(1 << 20);
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(a.value()->create_region(4096).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(a.value()->shard(1).share_spans({{0, ra->bytes, ra->base}}).code(),
            ErrorCode::kInvalidArgument);  // shared once, by create_region
}

}  // namespace
}  // namespace kvferry::ucx
