#include "transport/ucx/am_wire.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace kvferry::ucx {
namespace {

AmWriteHeader header(uint64_t offset, uint64_t length) {
  AmWriteHeader h;
  h.batch_id = 77;
  h.offset = offset;
  h.length = length;
  return h;
}

Status check(const AmWriteHeader& h, size_t payload, uint64_t region, AmWriteHeader* out) {
  return parse_write_header(&h, sizeof(h), payload, region, out);
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
  EXPECT_EQ(parse_write_header(&h, sizeof(h) - 1, 8, 4096, &out).code(),
            ErrorCode::kProtocolError);
  EXPECT_EQ(parse_write_header(nullptr, 0, 8, 4096, &out).code(), ErrorCode::kProtocolError);
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

}  // namespace
}  // namespace kvferry::ucx
