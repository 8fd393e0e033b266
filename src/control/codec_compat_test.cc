// The compatibility fingerprint on the wire (kvferry/messages.h PoolRegistration::compat,
// frame_compat): it round-trips, it is read without the rest of the frame, and a malformed one
// is refused whole.
#include <gtest/gtest.h>

#include "kvferry/messages.h"

namespace kvferry {
namespace {

const std::string kEndpoint = "tcp://127.0.0.1:5601";
const std::string kWorker = "w";
const std::string kRkey = "rkey";

PoolRegistration registration(Compat c) {
  PoolRegistration m;
  m.sender = {Role::kDecode, 0, 1, 0};
  m.compat = std::move(c);
  m.incarnation = 7;
  m.control_endpoint = kEndpoint;
  m.worker_address = kWorker;
  m.spans = {{0, 1 << 20, 0x1000, kRkey}};
  m.page_size = 16;
  m.page_bytes = 4096;
  m.num_pages = 8;
  m.kv_offsets = {0};
  m.aux_rows = 1;
  m.heads_per_rank = 1;
  return m;
}

const Compat kSample = {{"version", "0.1.0"}, {"page_size", "16"}, {"tp", "prefill 2 decode 1"}};

TEST(CodecCompat, RoundTripsAndIsReadAlone) {
  const std::string frame = encode(Message{registration(kSample)});
  auto m = decode(frame);
  ASSERT_TRUE(m.ok()) << m.status().str();
  EXPECT_EQ(std::get<PoolRegistration>(*m).compat, kSample);
  auto c = frame_compat(frame);
  ASSERT_TRUE(c.has_value());
  ASSERT_TRUE(c->ok());
  EXPECT_EQ(c->value(), kSample);
  // Only the header, the sender and the fingerprint are read: the rest may be anything.
  c = frame_compat(frame.substr(0, frame.size() - 1));  // the header's length no longer matches either
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->ok());  // the fingerprint is whole; what follows it is not read
  EXPECT_FALSE(decode(frame.substr(0, frame.size() - 1)).ok());
  // Not a registration: no fingerprint.
  RoomStatus st;
  st.room = 1;
  st.sender = {Role::kPrefill, 0, 0, 0};
  st.state = KVPoll::Success;
  st.failure.code = ErrorCode::kOk;
  st.incarnation = 3;
  EXPECT_FALSE(frame_compat(encode(Message{st})).has_value());
}

TEST(CodecCompat, AMalformedFingerprintIsRefusedWhole) {
  Compat many;
  for (size_t i = 0; i <= kMaxCompatFields; ++i) many.push_back({std::to_string(i).append("f"), "v"});
  for (const Compat& bad : {many, Compat{{"", "v"}}, Compat{{"a", "1"}, {"a", "2"}},
                            Compat{{"a", std::string(kMaxCompatValueBytes + 1, 'x')}}}) {
    const std::string frame = encode(Message{registration(bad)});
    EXPECT_FALSE(decode(frame).ok());
    auto c = frame_compat(frame);
    ASSERT_TRUE(c.has_value());
    EXPECT_FALSE(c->ok());
    EXPECT_EQ(c->status().code(), ErrorCode::kProtocolError);
  }
  // A count the body cannot hold fails before anything is allocated for it.
  std::string frame = encode(Message{registration(kSample)});
  frame[12 + 13] = '\xff';
  frame[12 + 13 + 1] = '\xff';
  auto c = frame_compat(frame);
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->ok());
}

}  // namespace
}  // namespace kvferry
