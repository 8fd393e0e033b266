// Several registered spans on each side (engine-shaped memory), over shm and tcp, one shard and
// several: writes land in the right span at the right place; an op across a span edge, in a gap
// or overflowing is refused by the sender, and over tcp again by the receiver against its own
// spans when the sender was lied to.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "transport/ucx/sharded_transport.h"
#include "transport/ucx/transport_test_util.h"

namespace kvferry::ucx {
namespace {

using testing::pattern_byte;
using testing::write_and_wait;

constexpr uint8_t kFill = 0x5A;
constexpr uint64_t kGuard = 64;  // bytes of kFill kept before and after every span's memory

// Caller-owned memory of several spans, each in its own allocation with guard bytes around it.
struct SpanSet {
  std::vector<std::unique_ptr<std::vector<uint8_t>>> memory;
  std::vector<MemorySpan> spans;

  explicit SpanSet(const std::vector<std::pair<uint64_t, uint64_t>>& offset_bytes) {
    for (auto [offset, bytes] : offset_bytes) {
      memory.push_back(std::make_unique<std::vector<uint8_t>>(bytes + 2 * kGuard, kFill));
      spans.push_back({memory.back()->data() + kGuard, bytes, offset, MemoryKind::kHost});
    }
  }
  // Every span's byte at offset o holds pattern_byte(o).
  void fill_pattern() {
    for (const MemorySpan& s : spans) {
      for (uint64_t k = 0; k < s.bytes; ++k) s.base[k] = pattern_byte(s.offset + k);
    }
  }
  // Span memory (and guards) as they must be after `ops` from a pattern-filled sender.
  std::vector<std::vector<uint8_t>> expected(const std::vector<WriteOp>& ops) const {
    std::vector<std::vector<uint8_t>> img;
    for (const auto& m : memory) img.emplace_back(m->size(), kFill);
    for (const WriteOp& op : ops) {
      for (uint64_t t = 0; t < op.length; ++t) {
        const uint64_t r = op.remote_offset + t;
        for (size_t i = 0; i < spans.size(); ++i) {
          if (r >= spans[i].offset && r - spans[i].offset < spans[i].bytes) {
            img[i][kGuard + (r - spans[i].offset)] = pattern_byte(op.local_offset + t);
          }
        }
      }
    }
    return img;
  }
  // "" when every span's memory (with its guards) equals `ops`' image, else the first difference.
  std::string diff(const std::vector<WriteOp>& ops) const {
    auto want = expected(ops);
    for (size_t i = 0; i < memory.size(); ++i) {
      for (size_t k = 0; k < want[i].size(); ++k) {
        if ((*memory[i])[k] != want[i][k]) {
          return "span " + std::to_string(i) + " byte " + std::to_string(k) + " (offset " +
                 std::to_string(spans[i].offset + k - kGuard) + "): " +
                 std::to_string((*memory[i])[k]) + " != " + std::to_string(want[i][k]);
        }
      }
    }
    return "";
  }
};

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kB2 = 8 * kMiB;          // B's span 2; span 3 follows it directly
constexpr uint64_t kB3 = kB2 + (64 << 10);

SpanSet sender_spans() { return SpanSet({{0, 64 << 10}, {kMiB, 256 << 10}, {3 * kMiB, 8192}}); }
// Not starting at 0, unsorted, with gaps, and two spans adjacent in the offset space.
SpanSet receiver_spans() {
  return SpanSet({{kMiB, 256 << 10}, {4096, 32 << 10}, {kB2, 64 << 10}, {kB3, 16 << 10}});
}

struct Shape {
  TransportKind kind;
  uint32_t a_shards;
  uint32_t b_shards;
};

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  return std::string(transport_name(info.param.kind)) + "_" + std::to_string(info.param.a_shards) +
         "to" + std::to_string(info.param.b_shards);
}

struct Pair {
  SpanSet sa = sender_spans();
  SpanSet sb = receiver_spans();
  std::unique_ptr<ShardedTransport> a, b;
  std::vector<LocalRegion> rb;
  PeerId peer = 0;
};

// A registers sa, B registers sb; A connects to B with `lie` applied to B's announcement.
std::unique_ptr<Pair> make_pair(const Shape& shape,
                                void (*lie)(RemoteRegionInfo&) = nullptr) {
  auto p = std::make_unique<Pair>();
  TransportOptions oa, ob;
  oa.kind = ob.kind = shape.kind;
  oa.shards = shape.a_shards;
  ob.shards = shape.b_shards;
  auto a = ShardedTransport::create(oa);
  auto b = ShardedTransport::create(ob);
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return p;
  p->a = std::move(a).value();
  p->b = std::move(b).value();
  p->sa.fill_pattern();
  auto ra = p->a->register_spans(p->sa.spans);
  auto rb = p->b->register_spans(p->sb.spans);
  EXPECT_TRUE(ra.ok()) << ra.status().str();
  EXPECT_TRUE(rb.ok()) << rb.status().str();
  if (!ra.ok() || !rb.ok()) return p;
  EXPECT_EQ(rb->size(), p->sb.spans.size());
  for (size_t i = 0; i < rb->size(); ++i) {  // one LocalRegion per span, in the order given
    EXPECT_EQ((*rb)[i].base, p->sb.spans[i].base);
    EXPECT_EQ((*rb)[i].offset, p->sb.spans[i].offset);
    EXPECT_EQ((*rb)[i].bytes, p->sb.spans[i].bytes);
    EXPECT_FALSE((*rb)[i].packed_rkey.empty());
  }
  p->rb = *rb;
  RemoteRegionInfo info = testing::remote_info(*p->b, p->rb);
  if (lie != nullptr) lie(info);
  auto id = p->a->connect(info);
  EXPECT_TRUE(id.ok()) << id.status().str();
  if (id.ok()) p->peer = id.value();
  return p;
}

class UcxSpansTest : public ::testing::TestWithParam<Shape> {};

TEST_P(UcxSpansTest, WritesLandInEverySpanAtTheirOffsets) {
  auto p = make_pair(GetParam());
  ASSERT_NE(p->peer, 0u);
  const std::vector<std::vector<WriteOp>> batches = {
      {{0, 4096, 4096},                          // A span 0 -> start of B span 1 (offset 4096)
       {kMiB + 5, kMiB + 1000, 100000}},         // unaligned, A span 1 -> B span 0
      {{3 * kMiB, kB2 + 1000, 4096},             // A span 2 -> B span 2
       {kMiB + 200000, kB3 + 100, 8000}},        // -> B span 3 (adjacent to span 2)
      {{10, 4096 + 30000, 100},                  // small, remote-contiguous: gathered
       {20, 4096 + 30100, 50},
       {3 * kMiB + 100, kB3 - 10, 10},           // remote-contiguous across the B2|B3 edge
       {3 * kMiB + 110, kB3, 10}},               //   (up to span 2's last byte): two writes
      {{(64 << 10) - 1, kMiB + (256 << 10) - 1, 1}},  // A span 0's last byte -> B span 0's
  };
  std::vector<WriteOp> ops;
  for (size_t room = 0; room < batches.size(); ++room) {  // rooms spread over the shards
    Status st = write_and_wait(*p->a, p->peer, room, batches[room]);
    ASSERT_TRUE(st.ok()) << "room " << room << ": " << st.str();
    ops.insert(ops.end(), batches[room].begin(), batches[room].end());
  }
  EXPECT_EQ(p->sb.diff(ops), "");
  uint64_t bytes = 0;
  for (const WriteOp& op : ops) bytes += op.length;
  EXPECT_EQ(p->a->stats().bytes_written, bytes);
  EXPECT_EQ(p->a->stats().failed_batches, 0u);
}

TEST_P(UcxSpansTest, OpsOutsideOneSpanAreRefusedBeforeAnythingIsWritten) {
  auto p = make_pair(GetParam());
  ASSERT_NE(p->peer, 0u);
  const std::vector<std::vector<WriteOp>> bad = {
      {{0, 4096, 8}, {(64 << 10) - 8, 4096, 16}},  // local: across A span 0's end (1st op fine)
      {{64 << 10, 4096, 8}},                       // local: in the gap after A span 0
      {{UINT64_MAX - 3, 4096, 8}},                 // local: offset + length overflows
      {{0, kB3 - 8, 16}},                          // remote: across the adjacent B2|B3 edge
      {{0, 0, 8}},                                 // remote: before B's first span
      {{0, 4096 + (32 << 10), 1}},                 // remote: in the gap after B span 1
      {{0, UINT64_MAX - 3, 8}},                    // remote: overflows
      {{0, 2, 0}},                                 // empty, but outside every remote span
      {{0, kB3 + (16 << 10) + 1, 0}},              // empty, past the last span's end
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    Status st = write_and_wait(*p->a, p->peer, i, bad[i]);
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << i << ": " << st.str();
    EXPECT_NE(st.message().find("span"), std::string::npos) << st.message();
  }
  EXPECT_EQ(p->sb.diff({}), "");
  EXPECT_EQ(p->a->stats().writes, 0u);
  EXPECT_EQ(p->a->stats().failed_batches, bad.size());
  // Empty ops at a span's end are inside it; the peer is still usable.
  EXPECT_TRUE(write_and_wait(*p->a, p->peer, 0, {{64 << 10, kB3 + (16 << 10), 0}}).ok());
  EXPECT_TRUE(write_and_wait(*p->a, p->peer, 1, {{0, 4096, 16}}).ok());
  EXPECT_EQ(p->sb.diff({{0, 4096, 16}}), "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, UcxSpansTest,
                         ::testing::Values(Shape{TransportKind::kShm, 1, 1},
                                           Shape{TransportKind::kShm, 2, 3},
                                           Shape{TransportKind::kTcp, 1, 1},
                                           Shape{TransportKind::kTcp, 3, 2}),
                         shape_name);

// The receiver copies (tcp): when the sender believes a lie about the receiver's spans, the
// receiver still refuses every write outside its OWN spans, small (scatter) and large.
class UcxSpansReceiverTest : public ::testing::TestWithParam<Shape> {};

TEST_P(UcxSpansReceiverTest, ReceiverRefusesWritesOutsideItsOwnSpans) {
  auto p = make_pair(GetParam(), [](RemoteRegionInfo& info) {
    info.spans[1].bytes += 256 << 10;  // B span 1 ([4096, +32 KiB)) claimed 256 KiB larger
    info.spans.push_back({kB3 + (16 << 10), 4096, 0x1000, "forged"});  // a span B never had
  });
  ASSERT_NE(p->peer, 0u);
  const uint64_t b1_end = 4096 + (32 << 10);
  const std::vector<std::vector<WriteOp>> lies = {
      {{0, b1_end - 8, 16}},                  // small: a scatter message across the real end
      {{kMiB, b1_end - 8, 100000}},           // large: one write message across it
      {{0, b1_end + 100, 64}},                // wholly past the real span
      {{0, kB3 + (16 << 10), 32}},            // into the forged span
      {{0, 4096, 16}, {16, b1_end, 8}},       // gathered: a fine piece, then past the end
  };
  for (size_t i = 0; i < lies.size(); ++i) {
    Status st = write_and_wait(*p->a, p->peer, i, lies[i]);
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << i << ": " << st.str();
    EXPECT_NE(st.message().find("peer refused"), std::string::npos) << st.message();
  }
  EXPECT_EQ(p->sb.diff({}), "") << "the receiver wrote outside its spans";
  uint64_t rejected = 0;
  for (size_t i = 0; i < p->b->shard_count(); ++i) rejected += p->b->shard(i).rejected_incoming();
  EXPECT_EQ(rejected, lies.size());
  // Writes inside the real spans still land.
  ASSERT_TRUE(write_and_wait(*p->a, p->peer, 9, {{0, b1_end - 16, 16}}).ok());
  EXPECT_EQ(p->sb.diff({{0, b1_end - 16, 16}}), "");
}

INSTANTIATE_TEST_SUITE_P(Tcp, UcxSpansReceiverTest,
                         ::testing::Values(Shape{TransportKind::kTcp, 1, 1},
                                           Shape{TransportKind::kTcp, 2, 3}),
                         shape_name);

}  // namespace
}  // namespace kvferry::ucx
