#include "transport/ucx/span_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kvferry::ucx {
namespace {

struct Range {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

Status shape(const std::vector<Range>& spans, std::vector<size_t>* order = nullptr) {
  std::vector<size_t> o;
  return check_spans(spans, 4, ErrorCode::kInvalidArgument, "test", order ? order : &o);
}

TEST(SpanTableTest, SpanListsAreCheckedAndSortedByOffset) {
  std::vector<size_t> order;
  ASSERT_TRUE(shape({{4096, 10}, {0, 4096}, {5000, 1}}, &order).ok());
  EXPECT_EQ(order, (std::vector<size_t>{1, 0, 2}));
  EXPECT_TRUE(shape({{UINT64_MAX - 9, 9}}).ok());  // ends exactly at the top
  EXPECT_EQ(shape({}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(shape({{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(shape({{0, 0}}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(shape({{UINT64_MAX - 9, 10}}).code(), ErrorCode::kInvalidArgument);  // overflows
  Status overlap = shape({{100, 50}, {0, 101}});
  EXPECT_EQ(overlap.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(overlap.message().find("span 0 overlaps span 1"), std::string::npos) << overlap.message();
  EXPECT_EQ(check_spans(std::vector<Range>{{0, 0}}, 4, ErrorCode::kProtocolError, "peer", &order).code(),
            ErrorCode::kProtocolError);
}

TEST(SpanTableTest, FindSpanHoldsTheWholeRangeOrNothing) {
  const std::vector<Range> sorted = {{0, 100}, {100, 50}, {1000, 24}};
  EXPECT_EQ(find_span(sorted, 0, 100), &sorted[0]);
  EXPECT_EQ(find_span(sorted, 100, 50), &sorted[1]);  // adjacent spans stay apart
  EXPECT_EQ(find_span(sorted, 99, 2), nullptr);       // across the edge of two adjacent spans
  EXPECT_EQ(find_span(sorted, 150, 1), nullptr);      // in the gap
  EXPECT_EQ(find_span(sorted, 1023, 1), &sorted[2]);
  EXPECT_EQ(find_span(sorted, 1024, 0), &sorted[2]);  // empty, at the end
  EXPECT_EQ(find_span(sorted, 1025, 0), nullptr);
  EXPECT_EQ(find_span(sorted, 1000, UINT64_MAX), nullptr);
  EXPECT_EQ(find_span(sorted, UINT64_MAX, 2), nullptr);
  EXPECT_EQ(find_span(std::vector<Range>{{10, 5}}, 3, 1), nullptr);  // before the first
}

TEST(SpanTableTest, ResolveGivesTheAddressInsideTheRightSpan) {
  std::vector<uint8_t> a(64), b(64);
  SpanTable t({{1 << 20, 64, b.data()}, {0, 64, a.data()}});
  EXPECT_EQ(t.resolve(10, 4), a.data() + 10);
  EXPECT_EQ(t.resolve((1 << 20) + 63, 1), b.data() + 63);
  EXPECT_EQ(t.resolve(64, 1), nullptr);
  EXPECT_EQ(t.resolve((1 << 20) + 60, 8), nullptr);
  EXPECT_EQ(t.describe(), "2 spans");
  EXPECT_EQ(SpanTable().resolve(0, 0), nullptr);
}

RemoteRegionInfo good_info() {
  RemoteRegionInfo info;
  info.worker_address = "worker";
  info.spans = {{0, 4096, 0x10000, "rkey-a"}, {8192, 4096, 0x90000, "rkey-b"}};
  return info;
}

TEST(SpanTableTest, PeerAnnouncementsAreCheckedBeforeUse) {
  std::vector<size_t> order;
  EXPECT_TRUE(check_remote_info(good_info(), true, &order).ok());
  auto expect_bad = [&](RemoteRegionInfo info, bool rkeys, const char* why) {
    Status st = check_remote_info(info, rkeys, &order);
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << why;
  };
  RemoteRegionInfo i = good_info();
  i.worker_address.clear();
  expect_bad(i, true, "empty worker address");
  i.worker_address.assign(kMaxWorkerAddressBytes + 1, 'x');
  expect_bad(i, false, "oversized worker address");
  i = good_info();
  i.spans.clear();
  expect_bad(i, false, "no spans");
  i = good_info();
  i.spans[1].offset = 4000;
  expect_bad(i, false, "overlap");
  i = good_info();
  i.spans[0].base = UINT64_MAX - 10;
  expect_bad(i, false, "base + bytes wraps");
  i = good_info();
  i.spans[0].base = 0;
  expect_bad(i, false, "null base");
  i = good_info();
  i.spans[1].packed_rkey.clear();
  expect_bad(i, true, "empty rkey over put");
  EXPECT_TRUE(check_remote_info(i, false, &order).ok());  // tcp needs no rkey
  i.spans[1].packed_rkey.assign(kMaxPackedRkeyBytes + 1, 'r');
  expect_bad(i, true, "oversized rkey");
  i = good_info();
  i.spans.assign(kMaxTransportSpans + 1, RemoteSpan{});
  for (size_t k = 0; k < i.spans.size(); ++k) i.spans[k] = {k * 10, 10, 0x1000 + k * 10, "r"};
  expect_bad(i, true, "too many spans");
}

}  // namespace
}  // namespace kvferry::ucx
