// The receiver-side room fence over tcp (kvferry/write_fence.h, docs/security.md "The room
// fence"): two UCX transports in one process, A writing into B, B with a fence installed.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "transport/ucx/sharded_transport.h"
#include "transport/ucx/transport_test_util.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {
namespace {

using testing::expected_image;
using testing::write_and_wait;

constexpr uint64_t kRegion = 16ull << 20;
constexpr uint8_t kFill = 0xEE;
constexpr uint64_t kRoomA = 0x1111'2222'3333'4444ull;  // bootstrap rooms are random 64-bit ids
constexpr uint64_t kRoomB = 0x5555'6666'7777'8888ull;
// Room A owns [0, 4 MiB) and [8 MiB, 9 MiB); room B owns [4 MiB, 8 MiB).
const std::vector<FenceRange> kPagesA = {{0, 4 << 20}, {8 << 20, 1 << 20}};
const std::vector<FenceRange> kPagesB = {{4 << 20, 4 << 20}};

struct Pair {
  std::unique_ptr<UcxTransport> a, b;
  LocalRegion ra, rb;
  PeerId peer = 0;
  std::shared_ptr<WriteFence> fence = std::make_shared<WriteFence>();
};

Pair make_pair(uint32_t am_flags) {
  Pair p;
  TransportOptions opt;
  opt.kind = TransportKind::kTcp;
  UcxTestHooks hooks;
  hooks.am_send_flags = am_flags;
  auto a = UcxTransport::create(opt, hooks);
  auto b = UcxTransport::create(opt);
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return p;
  p.a = std::move(a).value();
  p.b = std::move(b).value();
  p.b->set_write_fence(p.fence);
  testing::wire_pair(p, kRegion, kFill);
  return p;
}

bool region_equals(const LocalRegion& r, const std::vector<uint8_t>& img) {
  return img.size() == r.bytes && std::memcmp(r.base, img.data(), img.size()) == 0;
}

bool untouched(const LocalRegion& r) { return region_equals(r, std::vector<uint8_t>(r.bytes, kFill)); }

// Both message kinds: a large write (received straight into the pages) and small ones (a scatter).
std::vector<WriteOp> ops_into(uint64_t remote) {
  return {{0, remote, 1 << 20}, {2 << 20, remote + (2 << 20), 700}, {3 << 20, remote + (3 << 20), 512}};
}

// UCX's own choice, eager and rendezvous: every receiver path checks the fence.
constexpr uint32_t kAmProtocols[] = {0, UCP_AM_SEND_FLAG_EAGER, UCP_AM_SEND_FLAG_RNDV};

TEST(RoomFenceTest, WritesForAnOpenRoomLandByteExact) {
  for (uint32_t flags : kAmProtocols) {
    Pair p = make_pair(flags);
    ASSERT_NE(p.peer, 0u);
    ASSERT_TRUE(p.fence->open(kRoomA, kPagesA).ok());
    std::vector<WriteOp> ops = ops_into(0);
    ops.push_back({5 << 20, 8 << 20, 1 << 20});  // exactly A's second range
    Status st = write_and_wait(*p.a, p.peer, kRoomA, ops);
    ASSERT_TRUE(st.ok()) << flags << ": " << st.message();
    EXPECT_TRUE(region_equals(p.rb, expected_image(kRegion, kFill, ops))) << flags;
    EXPECT_EQ(p.b->fence_refusals(), 0u);
    EXPECT_EQ(p.fence->pinned(kRoomA), 0u);  // every placement let go of the room
  }
}

TEST(RoomFenceTest, WritesForAClosedOrUnknownRoomAreRefusedAndNotPlaced) {
  for (uint32_t flags : kAmProtocols) {
    Pair p = make_pair(flags);
    ASSERT_NE(p.peer, 0u);
    ASSERT_TRUE(p.fence->open(kRoomA, kPagesA).ok());
    EXPECT_EQ(p.fence->close(kRoomA), 0u);  // released: nothing of it runs
    for (uint64_t room : {kRoomA, kRoomB}) {  // closed, and never opened
      Status st = write_and_wait(*p.a, p.peer, room, ops_into(0));
      EXPECT_EQ(st.code(), ErrorCode::kTransferError) << flags << ": " << st.message();
      EXPECT_NE(st.message().find("room fence"), std::string::npos) << st.message();
      EXPECT_NE(st.message().find("not open"), std::string::npos) << st.message();
      EXPECT_NE(st.message().find(std::to_string(room)), std::string::npos) << st.message();
    }
    EXPECT_TRUE(untouched(p.rb)) << flags;
    EXPECT_GE(p.b->fence_refusals(), 2u);
    EXPECT_EQ(p.fence->refused_closed(), p.b->fence_refusals());
    EXPECT_EQ(p.b->rejected_incoming(), 0u);  // not a span refusal
    // The same pages opened for another room take that room's writes.
    ASSERT_TRUE(p.fence->open(kRoomB, kPagesA).ok());
    ASSERT_TRUE(write_and_wait(*p.a, p.peer, kRoomB, ops_into(0)).ok()) << flags;
    EXPECT_TRUE(region_equals(p.rb, expected_image(kRegion, kFill, ops_into(0)))) << flags;
  }
}

TEST(RoomFenceTest, AWriteNamingOneRoomIntoAnotherRoomsPagesIsRefused) {
  for (uint32_t flags : kAmProtocols) {
    Pair p = make_pair(flags);
    ASSERT_NE(p.peer, 0u);
    ASSERT_TRUE(p.fence->open(kRoomA, kPagesA).ok());
    ASSERT_TRUE(p.fence->open(kRoomB, kPagesB).ok());
    // Room A's name on room B's pages: the large write, then the scatter alone.
    Status st = write_and_wait(*p.a, p.peer, kRoomA, ops_into(4 << 20));
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << flags << ": " << st.message();
    EXPECT_NE(st.message().find("outside room"), std::string::npos) << st.message();
    st = write_and_wait(*p.a, p.peer, kRoomA, {{10, 5 << 20, 100}, {20, 100, 100}});
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << flags << ": " << st.message();
    // Straddling A's first range into B's pages, as one large write and as one scatter entry.
    st = write_and_wait(*p.a, p.peer, kRoomA, {{0, (4 << 20) - 4096, 1 << 20}});
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << flags << ": " << st.message();
    st = write_and_wait(*p.a, p.peer, kRoomA, {{0, (4 << 20) - 100, 200}});
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << flags << ": " << st.message();
    // A range of A's that is not in the receiver's ranges at all (between 9 MiB and the end).
    st = write_and_wait(*p.a, p.peer, kRoomA, {{0, 12 << 20, 1 << 20}});
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << flags << ": " << st.message();
    EXPECT_TRUE(untouched(p.rb)) << flags;
    // Six messages (the first batch is a large write and a scatter; both are refused: the batch
    // fails at the first refusal, the receiver counts every message; later batches on the same
    // endpoint are handled after them, so the count is complete here).
    EXPECT_EQ(p.fence->refused_outside(), 6u) << flags;
    EXPECT_EQ(p.fence->refused_closed(), 0u) << flags;
    // Room B's own writes still land; A is still open for its own pages.
    std::vector<WriteOp> ok = ops_into(4 << 20);
    ASSERT_TRUE(write_and_wait(*p.a, p.peer, kRoomB, ok).ok()) << flags;
    EXPECT_TRUE(region_equals(p.rb, expected_image(kRegion, kFill, ok))) << flags;
    EXPECT_TRUE(p.fence->is_open(kRoomA));
  }
}

// The fence installed through the composite transport reaches every shard: a room's writes go
// through shard room % 2 on the writer and land on the receiver's shard of the same index.
TEST(RoomFenceTest, EveryShardChecksTheFence) {
  TransportOptions opt;
  opt.kind = TransportKind::kTcp;
  opt.shards = 2;
  auto a = ShardedTransport::create(opt);
  auto b = ShardedTransport::create(opt);
  ASSERT_TRUE(a.ok() && b.ok());
  auto fence = std::make_shared<WriteFence>();
  (*b)->set_write_fence(fence);
  auto ra = (*a)->create_region(kRegion);
  auto rb = (*b)->create_region(kRegion);
  ASSERT_TRUE(ra.ok() && rb.ok());
  testing::fill_pattern(ra->base, ra->bytes);
  std::memset(rb->base, kFill, rb->bytes);
  auto peer = (*a)->connect(testing::remote_info(**b, *rb));
  ASSERT_TRUE(peer.ok()) << peer.status().message();
  const uint64_t even = 1000, odd = 1001;  // one room per shard
  for (uint64_t room : {even, odd}) {
    Status st = write_and_wait(**a, *peer, room, {{0, 0, 4096}});
    EXPECT_EQ(st.code(), ErrorCode::kTransferError) << room << ": " << st.message();
  }
  EXPECT_TRUE(untouched(*rb));
  EXPECT_EQ((*b)->shard(0).fence_refusals() + (*b)->shard(1).fence_refusals(), 2u);
  EXPECT_EQ(fence->refused_closed(), 2u);
  ASSERT_TRUE(fence->open(even, {{0, 4096}}).ok());
  ASSERT_TRUE(fence->open(odd, {{8192, 4096}}).ok());
  EXPECT_TRUE(write_and_wait(**a, *peer, even, {{0, 0, 4096}}).ok());
  EXPECT_TRUE(write_and_wait(**a, *peer, odd, {{8192, 8192, 4096}}).ok());
  EXPECT_EQ(write_and_wait(**a, *peer, odd, {{0, 0, 4096}}).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(std::memcmp(rb->base, ra->base, 4096), 0);
  EXPECT_EQ(std::memcmp(rb->base + 8192, ra->base + 8192, 4096), 0);
  EXPECT_EQ(rb->base[4096], kFill);
}

}  // namespace
}  // namespace kvferry::ucx
