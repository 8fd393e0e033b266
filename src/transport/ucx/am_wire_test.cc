#include "transport/ucx/am_wire.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace kvferry::ucx {
namespace {

AmWriteHeader header(uint64_t offset, uint64_t length) {
  AmWriteHeader h;
  h.batch_id = 77;
  h.offset = offset;
  h.length = length;
  return h;
}

// One span of `bytes` at offset 0 over a real buffer (0 bytes: no span at all).
SpanTable one_span(uint64_t bytes) {
  static std::vector<uint8_t> memory(1 << 16);
  if (bytes == 0) return SpanTable();
  return SpanTable({{0, bytes, memory.data()}});
}

Status check(const AmWriteHeader& h, size_t payload, uint64_t region, AmWriteHeader* out) {
  uint8_t* dst = nullptr;
  Status st = parse_write_header(&h, sizeof(h), payload, one_span(region), out, &dst);
  EXPECT_EQ(st.ok(), dst != nullptr);
  return st;
}

TEST(AmWireTest, AcceptsWritesInsideTheRegionUpToItsEnd) {
  AmWriteHeader out;
  EXPECT_TRUE(check(header(0, 4096), 4096, 4096, &out).ok());
  EXPECT_EQ(out.offset, 0u);
  EXPECT_EQ(out.length, 4096u);
  EXPECT_EQ(out.batch_id, 77u);
  EXPECT_TRUE(check(header(4000, 96), 96, 4096, &out).ok());
  EXPECT_TRUE(check(header(4096, 0), 0, 4096, &out).ok());
}

TEST(AmWireTest, RejectsRangesOutsideTheRegionIncludingOverflow) {
  AmWriteHeader out;
  EXPECT_EQ(check(header(4000, 97), 97, 4096, &out).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(out.batch_id, 77u);  // the sender can still be told which batch
  EXPECT_EQ(check(header(4097, 0), 0, 4096, &out).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(check(header(UINT64_MAX - 10, 100), 100, 4096, &out).code(),
            ErrorCode::kProtocolError);
  EXPECT_EQ(check(header(8, UINT64_MAX), 16, 4096, &out).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(check(header(0, 1), 1, 0, &out).code(), ErrorCode::kProtocolError);  // no region
}

TEST(AmWireTest, RejectsMalformedHeaders) {
  AmWriteHeader out;
  AmWriteHeader h = header(0, 8);
  uint8_t* dst = nullptr;
  EXPECT_EQ(parse_write_header(&h, sizeof(h) - 1, 8, one_span(4096), &out, &dst).code(),
            ErrorCode::kProtocolError);
  EXPECT_EQ(parse_write_header(nullptr, 0, 8, one_span(4096), &out, &dst).code(),
            ErrorCode::kProtocolError);
  h.magic = 0;
  EXPECT_EQ(check(h, 8, 4096, &out).code(), ErrorCode::kProtocolError);
  // The header must describe exactly the payload that came with it.
  EXPECT_EQ(check(header(0, 8), 16, 4096, &out).code(), ErrorCode::kProtocolError);
}

TEST(AmWireTest, AcksRoundTripAndRejectGarbage) {
  AmAck ack;
  ack.batch_id = 5;
  ack.code = static_cast<uint16_t>(ErrorCode::kProtocolError);
  AmAck out;
  ASSERT_TRUE(parse_ack(&ack, sizeof(ack), &out));
  EXPECT_EQ(out.batch_id, 5u);
  EXPECT_EQ(out.code, static_cast<uint16_t>(ErrorCode::kProtocolError));
  EXPECT_FALSE(parse_ack(&ack, sizeof(ack) - 2, &out));
  ack.magic = 1;
  EXPECT_FALSE(parse_ack(&ack, sizeof(ack), &out));
}

TEST(AmWireTest, RangeFits) {
  EXPECT_TRUE(range_fits(0, 0, 0));
  EXPECT_TRUE(range_fits(10, 0, 10));
  EXPECT_FALSE(range_fits(11, 0, 10));
  EXPECT_FALSE(range_fits(1, UINT64_MAX, UINT64_MAX));
  EXPECT_TRUE(range_fits(1, UINT64_MAX - 1, UINT64_MAX));
}

// A scatter message as a sender builds it: entry table, then each entry's data in order.
struct Scatter {
  AmScatterHeader h;
  std::vector<uint8_t> payload;
};

Scatter scatter(const std::vector<AmScatterEntry>& entries) {
  Scatter s;
  s.h.batch_id = 42;
  s.h.count = static_cast<uint32_t>(entries.size());
  s.payload.resize(entries.size() * sizeof(AmScatterEntry));
  std::memcpy(s.payload.data(), entries.data(), s.payload.size());
  uint8_t v = 1;
  for (const AmScatterEntry& e : entries) {
    for (uint64_t k = 0; k < e.length; ++k) s.payload.push_back(v++);
    s.h.data_bytes += e.length;
  }
  return s;
}

TEST(AmWireTest, ScatterPlacesEveryEntryAtItsOffset) {
  std::vector<uint8_t> region(256, 0xEE);
  Scatter s = scatter({{200, 3}, {0, 2}, {253, 3}});
  AmScatterHeader out;
  ASSERT_TRUE(parse_scatter_header(&s.h, sizeof(s.h), s.payload.size(), &out).ok());
  EXPECT_EQ(out.batch_id, 42u);
  EXPECT_EQ(out.count, 3u);
  EXPECT_EQ(out.data_bytes, 8u);
  ASSERT_TRUE(place_scatter(out, s.payload.data(), s.payload.size(), SpanTable({{0, 256, region.data()}})).ok());
  std::vector<uint8_t> want(256, 0xEE);
  want[200] = 1, want[201] = 2, want[202] = 3, want[0] = 4, want[1] = 5;
  want[253] = 6, want[254] = 7, want[255] = 8;
  EXPECT_EQ(region, want);
}

TEST(AmWireTest, ScatterWithAnyBadEntryWritesNothing) {
  const std::vector<std::vector<AmScatterEntry>> bad = {
      {{0, 4}, {254, 3}},                  // the second entry runs past the end
      {{0, 4}, {257, 0}},                  // starts past the end
      {{0, 4}, {UINT64_MAX - 1, 4}},       // offset + length wraps around
      {{0, 4}, {8, UINT64_MAX}},           // length alone is too big
  };
  for (const auto& entries : bad) {
    std::vector<uint8_t> region(256, 0xEE);
    Scatter s = scatter({{0, 4}});  // a valid payload, then the forged table
    s.h.count = static_cast<uint32_t>(entries.size());
    s.payload.assign(entries.size() * sizeof(AmScatterEntry), 0);
    std::memcpy(s.payload.data(), entries.data(), s.payload.size());
    s.payload.insert(s.payload.end(), {1, 2, 3, 4, 5, 6, 7});
    s.h.data_bytes = 7;
    Status st = place_scatter(s.h, s.payload.data(), s.payload.size(), SpanTable({{0, 256, region.data()}}));
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << entries[1].offset;
    EXPECT_EQ(region, std::vector<uint8_t>(256, 0xEE)) << "written despite a bad entry";
  }
}

// Two spans with a gap between them in the offset space: [100, 164) and [200, 232), each over
// its own buffer. Writes resolve into the right buffer; anything across an edge or into the gap
// is refused, and nothing at all is written for a scatter with one such entry.
TEST(AmWireTest, WritesResolveAgainstSeveralSpansAndNeverCrossAnEdge) {
  std::vector<uint8_t> a(64, 0xEE), b(32, 0xEE);
  SpanTable spans({{200, 32, b.data()}, {100, 64, a.data()}});  // any order
  AmWriteHeader out;
  uint8_t* dst = nullptr;
  AmWriteHeader h = header(160, 4);
  ASSERT_TRUE(parse_write_header(&h, sizeof(h), 4, spans, &out, &dst).ok());
  EXPECT_EQ(dst, a.data() + 60);
  h = header(200, 32);
  ASSERT_TRUE(parse_write_header(&h, sizeof(h), 32, spans, &out, &dst).ok());
  EXPECT_EQ(dst, b.data());
  for (auto [off, len] : std::vector<std::pair<uint64_t, uint64_t>>{
           {161, 4}, {164, 1}, {190, 20}, {99, 2}, {231, 2}, {0, 1}, {150, 60}, {232, 1}}) {
    h = header(off, len);
    EXPECT_EQ(parse_write_header(&h, sizeof(h), len, spans, &out, &dst).code(),
              ErrorCode::kProtocolError)
        << off << "+" << len;
    EXPECT_EQ(dst, nullptr);
  }
  Scatter ok = scatter({{100, 2}, {230, 2}});
  ASSERT_TRUE(place_scatter(ok.h, ok.payload.data(), ok.payload.size(), spans).ok());
  EXPECT_EQ(a[0], 1);
  EXPECT_EQ(a[1], 2);
  EXPECT_EQ(b[30], 3);
  EXPECT_EQ(b[31], 4);
  std::vector<uint8_t> a0 = a, b0 = b;
  Scatter bad = scatter({{200, 2}, {162, 4}});  // the second entry crosses a's end
  EXPECT_EQ(place_scatter(bad.h, bad.payload.data(), bad.payload.size(), spans).code(),
            ErrorCode::kProtocolError);
  EXPECT_EQ(a, a0);
  EXPECT_EQ(b, b0);
}

TEST(AmWireTest, ScatterEntriesMustCoverExactlyTheData) {
  std::vector<uint8_t> region(256, 0xEE);
  Scatter s = scatter({{0, 4}, {16, 4}});
  AmScatterHeader h = s.h;
  h.data_bytes = 7;  // entries say 8
  s.payload.pop_back();
  EXPECT_EQ(place_scatter(h, s.payload.data(), s.payload.size(), SpanTable({{0, 256, region.data()}})).code(),
            ErrorCode::kProtocolError);
  h.data_bytes = 9;  // entries say 8
  s.payload.push_back(0);
  s.payload.push_back(0);
  EXPECT_EQ(place_scatter(h, s.payload.data(), s.payload.size(), SpanTable({{0, 256, region.data()}})).code(),
            ErrorCode::kProtocolError);
  EXPECT_EQ(region, std::vector<uint8_t>(256, 0xEE));
  EXPECT_EQ(place_scatter(s.h, s.payload.data(), s.payload.size(), SpanTable()).code(),
            ErrorCode::kProtocolError);
}

TEST(AmWireTest, ScatterHeaderIsCheckedBeforeAnyDataIsReceived) {
  AmScatterHeader out;
  Scatter s = scatter({{0, 4}, {16, 4}});
  const size_t n = s.payload.size();
  EXPECT_EQ(parse_scatter_header(&s.h, sizeof(s.h) - 1, n, &out).code(),
            ErrorCode::kProtocolError);
  EXPECT_EQ(parse_scatter_header(nullptr, 0, n, &out).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(parse_scatter_header(&s.h, sizeof(s.h), n + 1, &out).code(),
            ErrorCode::kProtocolError);
  EXPECT_EQ(out.batch_id, 42u);  // the sender can still be told
  AmScatterHeader h = s.h;
  h.magic = 7;
  EXPECT_EQ(parse_scatter_header(&h, sizeof(h), n, &out).code(), ErrorCode::kProtocolError);
  h = s.h;
  h.count = 0;
  EXPECT_EQ(parse_scatter_header(&h, sizeof(h), 8, &out).code(), ErrorCode::kProtocolError);
  h.count = kScatterMaxEntries + 1;  // would need a bounce buffer over the limit
  h.data_bytes = 0;
  EXPECT_EQ(parse_scatter_header(&h, sizeof(h), h.count * sizeof(AmScatterEntry), &out).code(),
            ErrorCode::kProtocolError);
  h.count = 1;
  h.data_bytes = kScatterMaxDataBytes + 1;
  EXPECT_EQ(parse_scatter_header(&h, sizeof(h), sizeof(AmScatterEntry) + h.data_bytes, &out)
                .code(),
            ErrorCode::kProtocolError);
  h.data_bytes = kScatterMaxDataBytes;  // the limits themselves are fine
  EXPECT_TRUE(
      parse_scatter_header(&h, sizeof(h), sizeof(AmScatterEntry) + h.data_bytes, &out).ok());
}

// Wire version 2: every header and ack names its room, and a version-1 peer is refused by size
// and magic (its headers had no room), with an error that says so, never misread.
TEST(AmWireTest, HeadersAndAcksCarryTheRoom) {
  AmWriteHeader h = header(64, 8);
  h.room = 0xfeedfacecafef00dull;
  AmWriteHeader out;
  ASSERT_TRUE(check(h, 8, 4096, &out).ok());
  EXPECT_EQ(out.room, 0xfeedfacecafef00dull);
  h.offset = 5000;  // refused by the span check: the room still comes back for the ack
  EXPECT_FALSE(check(h, 8, 4096, &out).ok());
  EXPECT_EQ(out.room, 0xfeedfacecafef00dull);

  Scatter s = scatter({{0, 4}});
  s.h.room = 12345;
  AmScatterHeader sh;
  ASSERT_TRUE(parse_scatter_header(&s.h, sizeof(s.h), s.payload.size(), &sh).ok());
  EXPECT_EQ(sh.room, 12345u);
  ASSERT_FALSE(parse_scatter_header(&s.h, sizeof(s.h), s.payload.size() + 1, &sh).ok());
  EXPECT_EQ(sh.room, 12345u);

  AmAck ack;
  ack.batch_id = 9;
  ack.room = 777;
  ack.code = static_cast<uint16_t>(ErrorCode::kTransferError);
  ack.refusal = static_cast<uint16_t>(AmRefusal::kRoomClosed);
  AmAck a;
  ASSERT_TRUE(parse_ack(&ack, sizeof(ack), &a));
  EXPECT_EQ(a.room, 777u);
  EXPECT_EQ(a.refusal, static_cast<uint16_t>(AmRefusal::kRoomClosed));
  ack.refusal = kMaxAmRefusal + 1;  // an unknown refusal code: malformed
  EXPECT_FALSE(parse_ack(&ack, sizeof(ack), &a));
}

TEST(AmWireTest, RefusesVersionOneHeadersAndAcks) {
  // Version 1 layouts: no room field.
  struct V1Write {
    uint32_t magic = kAmMagicV1;
    uint32_t op_index = 0;
    uint64_t batch_id = 3;
    uint64_t offset = 0;
    uint64_t length = 8;
  } w1;
  struct V1Scatter {
    uint32_t magic = kAmMagicV1;
    uint32_t count = 1;
    uint64_t batch_id = 3;
    uint64_t data_bytes = 8;
  } s1;
  struct V1Ack {
    uint32_t magic = kAmMagicV1;
    uint16_t code = 0;
    uint16_t reserved = 0;
    uint64_t batch_id = 3;
  } a1;
  static_assert(sizeof(V1Write) == 32 && sizeof(V1Scatter) == 24 && sizeof(V1Ack) == 16);
  AmWriteHeader out;
  uint8_t* dst = nullptr;
  Status st = parse_write_header(&w1, sizeof(w1), 8, one_span(4096), &out, &dst);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("wire version 1"), std::string::npos) << st.message();
  EXPECT_EQ(dst, nullptr);
  AmScatterHeader sh;
  st = parse_scatter_header(&s1, sizeof(s1), sizeof(AmScatterEntry) + 8, &sh);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("wire version 1"), std::string::npos) << st.message();
  AmAck a;
  EXPECT_FALSE(parse_ack(&a1, sizeof(a1), &a));
  // The version-1 magic in a header of today's size is refused too (never read as version 2).
  AmWriteHeader h = header(0, 8);
  h.magic = kAmMagicV1;
  st = check(h, 8, 4096, &out);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("wire version 1"), std::string::npos) << st.message();
  AmAck ack;
  ack.magic = kAmMagicV1;
  EXPECT_FALSE(parse_ack(&ack, sizeof(ack), &a));
}

// place_scatter with a pin of the room's fence: every entry must lie inside the room's ranges
// (checked before anything is copied); one entry outside refuses the whole message.
TEST(AmWireTest, ScatterChecksEveryEntryAgainstTheRoom) {
  std::vector<uint8_t> region(256, 0xEE);
  SpanTable spans({{0, 256, region.data()}});
  WriteFence fence;
  ASSERT_TRUE(fence.open(5, {{0, 16}, {200, 56}}).ok());
  WriteFence::Pin pin = fence.pin(5);
  Scatter ok = scatter({{200, 3}, {0, 16}});
  ok.h.room = 5;
  AmRefusal refusal = AmRefusal::kSpan;
  ASSERT_TRUE(place_scatter(ok.h, ok.payload.data(), ok.payload.size(), spans, &pin, &refusal).ok());
  EXPECT_EQ(refusal, AmRefusal::kNone);
  EXPECT_EQ(region[200], 1);
  std::fill(region.begin(), region.end(), 0xEE);
  Scatter bad = scatter({{200, 3}, {10, 8}});  // [10, 18) straddles the room's first range
  bad.h.room = 5;
  Status st = place_scatter(bad.h, bad.payload.data(), bad.payload.size(), spans, &pin, &refusal);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_EQ(refusal, AmRefusal::kOutsideRoom);
  EXPECT_EQ(region, std::vector<uint8_t>(256, 0xEE));  // nothing written, not even entry 0
  Scatter span = scatter({{250, 10}});  // outside the spans: the span check says so first
  span.h.room = 5;
  st = place_scatter(span.h, span.payload.data(), span.payload.size(), spans, &pin, &refusal);
  EXPECT_EQ(refusal, AmRefusal::kSpan);
  // Without a pin (no fence installed) only the spans count.
  EXPECT_TRUE(place_scatter(bad.h, bad.payload.data(), bad.payload.size(), spans).ok());
}

}  // namespace
}  // namespace kvferry::ucx
