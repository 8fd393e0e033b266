#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kvferry/messages.h"

namespace kvferry {
namespace {

RankId prefill(uint32_t tp) { return RankId{Role::kPrefill, 0, tp, 0}; }
RankId decode_rank(uint32_t tp) { return RankId{Role::kDecode, 3, tp, 2}; }

PoolRegistration sample_registration() {
  PoolRegistration m;
  m.sender = decode_rank(1);
  m.control_endpoint = "tcp://127.0.0.1:5601";
  m.worker_address = std::string("\x00\x01\xffworker", 9);
  m.packed_rkey = std::string(300, '\x7f');
  m.region_base = 0x7f00'1234'5678'9abcull;
  m.region_bytes = 1ull << 40;
  m.page_size = 16;
  m.page_bytes = 65536;
  m.num_pages = 12345;
  m.num_buffers = 64;
  m.aux_slots = 256;
  m.heads_per_rank = 4;
  m.first_head = 8;
  return m;
}

RoomMetadata sample_metadata(size_t n) {
  RoomMetadata m;
  m.room = 0x7fff'ffff'ffff'fffeull;
  m.sender = decode_rank(0);
  for (size_t i = 0; i < n; ++i) m.kv_indices.push_back(i * 7 + (i % 3 == 0 ? 1ull << 40 : 0));
  m.aux_slot = 17;
  m.expected_senders = 2;
  return m;
}

RoomStatus sample_status() {
  RoomStatus m;
  m.room = 42;
  m.sender = prefill(1);
  m.state = KVPoll::Failed;
  m.code = ErrorCode::kTransferError;
  m.origin = decode_rank(0);
  m.first_seen_ns = -5;
  m.reason = "ucp_put_nbx: Endpoint timeout";
  return m;
}

Heartbeat sample_heartbeat() { return Heartbeat{prefill(3), 99, 1234567890123ll}; }

template <typename T>
T round_trip(const T& m) {
  const std::string frame = encode(Message(m));
  auto r = decode(frame);
  EXPECT_TRUE(r.ok()) << r.status().str();
  if (!r.ok()) return T{};
  EXPECT_TRUE(std::holds_alternative<T>(*r));
  EXPECT_EQ(encode(*r), frame);
  return std::get<T>(*r);
}

// Frame helpers for hand-made corruptions.
void put_le(std::string& f, size_t off, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) f[off + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void fix_body_length(std::string& f) { put_le(f, 8, f.size() - 12, 4); }

void expect_rejected(const std::string& frame, const std::string& mentions) {
  auto r = decode(frame);
  ASSERT_FALSE(r.ok()) << "accepted a bad frame; expected error mentioning " << mentions;
  EXPECT_EQ(r.status().code(), ErrorCode::kProtocolError);
  EXPECT_NE(r.status().message().find(mentions), std::string::npos) << r.status().message();
}

TEST(Codec, PoolRegistrationRoundTrip) {
  const auto m = sample_registration();
  const auto d = round_trip(m);
  EXPECT_EQ(d.sender, m.sender);
  EXPECT_EQ(d.control_endpoint, m.control_endpoint);
  EXPECT_EQ(d.worker_address, m.worker_address);
  EXPECT_EQ(d.packed_rkey, m.packed_rkey);
  EXPECT_EQ(d.region_base, m.region_base);
  EXPECT_EQ(d.region_bytes, m.region_bytes);
  EXPECT_EQ(d.page_size, 16u);
  EXPECT_EQ(d.page_bytes, 65536u);
  EXPECT_EQ(d.num_pages, 12345u);
  EXPECT_EQ(d.num_buffers, 64u);
  EXPECT_EQ(d.aux_slots, 256u);
  EXPECT_EQ(d.heads_per_rank, 4u);
  EXPECT_EQ(d.first_head, 8u);
}

TEST(Codec, PoolRegistrationEmptyStrings) {
  PoolRegistration m;
  const auto d = round_trip(m);
  EXPECT_EQ(d.control_endpoint, "");
  EXPECT_EQ(d.packed_rkey, "");
  EXPECT_EQ(encode(Message(m)).size(), 12u + 13 + 3 * 4 + 8 * 4 + 4 * 5);
}

TEST(Codec, RoomMetadataRoundTrip) {
  const auto m = sample_metadata(5);
  const auto d = round_trip(m);
  EXPECT_EQ(d.room, m.room);
  EXPECT_EQ(d.sender, m.sender);
  EXPECT_EQ(d.kv_indices, m.kv_indices);
  EXPECT_EQ(d.aux_slot, 17u);
  EXPECT_EQ(d.expected_senders, 2u);
}

TEST(Codec, RoomMetadataEmptyAndLargeIndices) {
  EXPECT_TRUE(round_trip(sample_metadata(0)).kv_indices.empty());
  const auto big = sample_metadata(1 << 20);
  const auto d = round_trip(big);
  ASSERT_EQ(d.kv_indices.size(), size_t{1} << 20);
  EXPECT_EQ(d.kv_indices, big.kv_indices);
  EXPECT_EQ(encode(Message(big)).size(), 12u + 8 + 13 + 4 + 8 * (size_t{1} << 20) + 8);
}

TEST(Codec, RoomStatusRoundTrip) {
  const auto m = sample_status();
  const auto d = round_trip(m);
  EXPECT_EQ(d.room, 42u);
  EXPECT_EQ(d.sender, m.sender);
  EXPECT_EQ(d.state, KVPoll::Failed);
  EXPECT_EQ(d.code, ErrorCode::kTransferError);
  EXPECT_EQ(d.origin, m.origin);
  EXPECT_EQ(d.first_seen_ns, -5);
  EXPECT_EQ(d.reason, m.reason);

  RoomStatus ok;
  ok.state = KVPoll::Success;
  ok.code = ErrorCode::kOk;
  const auto d2 = round_trip(ok);
  EXPECT_EQ(d2.state, KVPoll::Success);
  EXPECT_EQ(d2.reason, "");
}

TEST(Codec, RoomStatusNotTerminalRoundTrip) {
  RoomStatus m = sample_status();
  EXPECT_TRUE(round_trip(m).terminal);  // the default: terminal, no flags byte
  const size_t terminal_bytes = encode(Message(m)).size();
  m.terminal = false;
  const auto d = round_trip(m);
  EXPECT_FALSE(d.terminal);
  EXPECT_EQ(d.state, KVPoll::Failed);
  EXPECT_EQ(d.code, ErrorCode::kTransferError);
  EXPECT_EQ(d.origin, m.origin);
  EXPECT_EQ(d.reason, m.reason);
  EXPECT_EQ(encode(Message(m)).size(), terminal_bytes + 1);  // one trailing flags byte
}

TEST(Codec, RoomStatusEveryFailureCode) {
  for (int c = 1; c <= kMaxErrorCode; ++c) {
    RoomStatus m = sample_status();
    m.code = static_cast<ErrorCode>(c);
    EXPECT_EQ(static_cast<int>(round_trip(m).code), c);
  }
}

TEST(Codec, OverlongReasonIsTruncatedNotRejected) {
  RoomStatus m = sample_status();
  m.reason = std::string(kMaxStringBytes + 100, 'r');
  auto r = decode(encode(Message(m)));
  ASSERT_TRUE(r.ok()) << r.status().str();
  EXPECT_EQ(std::get<RoomStatus>(*r).reason.size(), kMaxStringBytes);
}

TEST(Codec, HeartbeatRoundTrip) {
  const auto d = round_trip(sample_heartbeat());
  EXPECT_EQ(d.sender, prefill(3));
  EXPECT_EQ(d.seq, 99u);
  EXPECT_EQ(d.sent_ns, 1234567890123ll);
}

TEST(Codec, HeaderLayoutIsLittleEndian) {
  const std::string f = encode(Message(sample_heartbeat()));
  ASSERT_EQ(f.size(), 12u + 13 + 8 + 8);
  EXPECT_EQ(f.substr(0, 4), "KVFY");
  EXPECT_EQ(f[4], 1);  // version 1, low byte first
  EXPECT_EQ(f[5], 0);
  EXPECT_EQ(f[6], 4);  // type Heartbeat
  EXPECT_EQ(f[8], 29);  // body length
  EXPECT_EQ(f[12], 0);  // sender role prefill
  EXPECT_EQ(f[12 + 5], 3);  // sender tp_rank
  EXPECT_EQ(f[12 + 13], 99);  // seq
}

TEST(Codec, MessageNames) {
  EXPECT_EQ(message_name(Message(PoolRegistration{})), "PoolRegistration");
  EXPECT_EQ(message_name(Message(RoomMetadata{})), "RoomMetadata");
  EXPECT_EQ(message_name(Message(RoomStatus{})), "RoomStatus");
  EXPECT_EQ(message_name(Message(Heartbeat{})), "Heartbeat");
}

TEST(CodecReject, EmptyAndShortHeader) {
  expect_rejected("", "empty frame");
  expect_rejected("KVFY\x01", "header");
  expect_rejected(encode(Message(sample_heartbeat())).substr(0, 11), "header");
}

TEST(CodecReject, BadMagicVersionType) {
  std::string f = encode(Message(sample_heartbeat()));
  std::string g = f;
  g[0] = 'X';
  expect_rejected(g, "magic");
  g = f;
  put_le(g, 4, 2, 2);
  expect_rejected(g, "version");
  g = f;
  put_le(g, 4, 0, 2);
  expect_rejected(g, "version");
  g = f;
  put_le(g, 6, 0, 2);
  expect_rejected(g, "type");
  g = f;
  put_le(g, 6, 5, 2);
  expect_rejected(g, "type");
}

TEST(CodecReject, BodyLengthMismatchBothWays) {
  const std::string f = encode(Message(sample_heartbeat()));
  std::string g = f;
  put_le(g, 8, f.size() - 12 + 1, 4);  // header claims more than the frame has
  expect_rejected(g, "body_length");
  g = f;
  put_le(g, 8, f.size() - 12 - 1, 4);  // header claims less: extra bytes
  expect_rejected(g, "body_length");
  g = f.substr(0, f.size() - 3);  // truncated frame, header unchanged
  expect_rejected(g, "body_length");
}

TEST(CodecReject, TruncatedFieldsNameTheField) {
  std::string f = encode(Message(sample_heartbeat()));
  f.resize(f.size() - 4);
  fix_body_length(f);
  expect_rejected(f, "Heartbeat.sent_ns");

  // PoolRegistration cut inside control_endpoint's length prefix.
  f = encode(Message(sample_registration()));
  f.resize(12 + 13 + 2);
  fix_body_length(f);
  expect_rejected(f, "PoolRegistration.control_endpoint");
}

TEST(CodecReject, StringLengthPastEndAndOverLimit) {
  std::string f = encode(Message(sample_registration()));
  const size_t len_off = 12 + 13;  // control_endpoint length
  std::string g = f;
  put_le(g, len_off, f.size(), 4);  // longer than the body, within the limit
  expect_rejected(g, "PoolRegistration.control_endpoint");
  expect_rejected(g, "past the end");
  g = f;
  put_le(g, len_off, kMaxStringBytes + 1, 4);
  expect_rejected(g, "exceeds the limit");

  RoomStatus s = sample_status();
  s.reason = "abc";
  g = encode(Message(s));
  put_le(g, g.size() - 7, 4, 4);  // reason length 4, only 3 bytes follow
  expect_rejected(g, "RoomStatus.reason");
}

TEST(CodecReject, KvIndicesCount) {
  std::string f = encode(Message(sample_metadata(2)));
  const size_t count_off = 12 + 8 + 13;
  std::string g = f;
  put_le(g, count_off, kMaxKvIndices + 1, 4);
  expect_rejected(g, "RoomMetadata.kv_indices");
  expect_rejected(g, "exceeds the limit");
  g = f;
  put_le(g, count_off, kMaxKvIndices, 4);  // allowed count, but the body is far too short
  expect_rejected(g, "past the end");
  g = f;
  put_le(g, count_off, 3, 4);  // one more than present: eats the trailing u32s then runs short
  expect_rejected(g, "RoomMetadata");
}

TEST(CodecReject, BadEnums) {
  const std::string f = encode(Message(sample_status()));
  const size_t state_off = 12 + 8 + 13;
  std::string g = f;
  g[state_off] = 5;
  expect_rejected(g, "RoomStatus.state");
  g[state_off] = static_cast<char>(0xff);
  expect_rejected(g, "RoomStatus.state");
  g[state_off] = static_cast<char>(KVPoll::Transferring);  // not terminal
  expect_rejected(g, "RoomStatus.state");

  g = f;
  put_le(g, state_off + 1, kMaxErrorCode + 1, 2);
  expect_rejected(g, "RoomStatus.code");
  g = f;
  put_le(g, state_off + 1, 0, 2);  // Failed with ok
  expect_rejected(g, "RoomStatus.code");

  g = f;
  g[12 + 8] = 2;  // sender role
  expect_rejected(g, "RoomStatus.sender");
  g = f;
  g[state_off + 3] = 7;  // origin role
  expect_rejected(g, "RoomStatus.origin");

  std::string h = encode(Message(sample_heartbeat()));
  h[12] = 2;
  expect_rejected(h, "Heartbeat.sender");
}

TEST(CodecReject, RoomStatusFlags) {
  RoomStatus m = sample_status();
  m.terminal = false;
  const std::string f = encode(Message(m));
  std::string g = f;
  g.back() = 0;  // present but says terminal: not canonical (terminal frames carry no flags)
  expect_rejected(g, "RoomStatus.flags");
  g.back() = 3;  // an unknown bit
  expect_rejected(g, "RoomStatus.flags");
  g.back() = static_cast<char>(0x80);
  expect_rejected(g, "RoomStatus.flags");

  RoomStatus ok;
  ok.state = KVPoll::Success;
  ok.code = ErrorCode::kOk;
  g = encode(Message(ok));
  g.push_back(1);  // Success is always terminal
  fix_body_length(g);
  expect_rejected(g, "RoomStatus.flags");

  g = f;
  g.push_back(0);  // more than the one flags byte
  fix_body_length(g);
  expect_rejected(g, "trailing");
}

TEST(CodecReject, TrailingBytes) {
  std::string f = encode(Message(sample_metadata(3)));
  f.push_back('\0');
  fix_body_length(f);
  expect_rejected(f, "trailing");
}

// Deterministic fuzz: mutations of valid frames never crash decode, and every frame decode
// accepts re-encodes to exactly the same bytes (the encoding is canonical).
TEST(CodecFuzz, MutatedFramesNeverCrashAndAcceptedOnesAreCanonical) {
  RoomStatus ok_status;
  ok_status.state = KVPoll::Success;
  RoomStatus early_status = sample_status();
  early_status.terminal = false;
  const std::vector<std::string> seeds = {
      encode(Message(sample_registration())), encode(Message(PoolRegistration{})),
      encode(Message(sample_metadata(0))),    encode(Message(sample_metadata(40))),
      encode(Message(sample_status())),       encode(Message(ok_status)),
      encode(Message(sample_heartbeat())),    encode(Message(early_status)),
  };
  std::mt19937_64 rng(20240611);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string f = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 6) {
        case 0:  // flip a byte
          if (!f.empty()) f[rng() % f.size()] = static_cast<char>(rng());
          break;
        case 1:  // truncate
          f.resize(rng() % (f.size() + 1));
          break;
        case 2:  // append junk
          for (int k = static_cast<int>(rng() % 9); k > 0; --k) f.push_back(static_cast<char>(rng()));
          break;
        case 3:  // overwrite a u32 (a length or count) with a small or huge value
          if (f.size() >= 4) {
            const uint32_t v = (rng() % 2) ? static_cast<uint32_t>(rng() % 64)
                                            : static_cast<uint32_t>(rng());
            put_le(f, rng() % (f.size() - 3), v, 4);
          }
          break;
        case 4:  // repair the body length so the body parser is exercised
          if (f.size() >= 12) fix_body_length(f);
          break;
        default:  // toggle a small enum-ish byte
          if (f.size() > 12) f[12 + rng() % (f.size() - 12)] = static_cast<char>(rng() % 12);
          break;
      }
    }
    auto r = decode(f);
    if (r.ok()) {
      ++accepted;
      ASSERT_EQ(encode(*r), f) << "iteration " << iter;
    } else {
      ++rejected;
      ASSERT_EQ(r.status().code(), ErrorCode::kProtocolError);
      ASSERT_FALSE(r.status().message().empty());
    }
  }
  // The mix must exercise both paths.
  EXPECT_GT(accepted, 500);
  EXPECT_GT(rejected, 5000);
}

}  // namespace
}  // namespace kvferry
