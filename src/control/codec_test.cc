#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "control/codec_test_util.h"
#include "kvferry/messages.h"

namespace kvferry {
namespace {

RankId prefill(uint32_t tp) { return RankId{Role::kPrefill, 0, tp, 0}; }
RankId decode_rank(uint32_t tp) { return RankId{Role::kDecode, 3, tp, 2}; }

PoolRegistration sample_registration() {
  PoolRegistration m;
  m.sender = decode_rank(1);
  m.incarnation = 0x1234'5678'9abc'def0ull;
  m.peer_incarnation = 0x0fed'cba9'8765'4321ull;
  m.control_endpoint = "tcp://127.0.0.1:5601";
  m.worker_address = std::string("\x00\x01\xffworker", 9);
  m.spans = {{0, 1ull << 40, 0x7f00'1234'5678'9abcull, std::string(300, '\x7f')},
             {1ull << 41, 4096, 0x7e00'0000'0000'0000ull, "k2"}};
  m.page_size = 16;
  m.page_bytes = 65536;
  m.num_pages = 12345;
  for (uint64_t b = 0; b < 64; ++b) m.kv_offsets.push_back(b * 65536 * 12345);
  m.aux_offsets = {1ull << 41, (1ull << 41) + 2048};
  m.aux_item_bytes = {8, 4};
  m.aux_rows = 256;
  m.state_offsets = {(1ull << 40) - 4096};
  m.state_item_bytes = {16};
  m.state_rows = 200;
  m.guard_offset = (1ull << 40) - 16384;
  m.heads_per_rank = 4;
  m.first_head = 8;
  return m;
}

// The smallest registration decode() accepts: one span, one KV buffer, no aux or state buffer.
PoolRegistration minimal_registration() {
  PoolRegistration m;
  m.incarnation = 1;
  m.spans = {{0, 1, 0, ""}};
  m.page_size = 1;
  m.page_bytes = 1;
  m.num_pages = 1;
  m.kv_offsets = {0};
  m.aux_rows = 1;
  m.heads_per_rank = 1;
  return m;
}

RoomMetadata sample_metadata(size_t n) {
  RoomMetadata m;
  m.room = 0x7fff'ffff'ffff'fffeull;
  m.sender = decode_rank(0);
  m.incarnation = 7;
  m.peer_incarnation = 1ull << 63;
  for (size_t i = 0; i < n; ++i) m.kv_indices.push_back(i * 7 + (i % 3 == 0 ? 1ull << 40 : 0));
  m.aux_index = 17;
  m.state_indices = {3, 1ull << 33};
  m.expected_senders = 2;
  return m;
}

RoomStatus sample_status() {
  RoomStatus m;
  m.room = 42;
  m.sender = prefill(1);
  m.incarnation = 1'764'000'000'000'000'001;
  m.peer_incarnation = 5;
  m.state = KVPoll::Failed;
  m.failure.code = ErrorCode::kTransferError;
  m.failure.origin = decode_rank(0);
  m.failure.first_seen_ns = -5;
  m.failure.reason = "ucp_put_nbx: Endpoint timeout";
  m.failure.wall_ns = 1'764'000'000'123'456'789;
  return m;
}

Heartbeat sample_heartbeat() { return Heartbeat{prefill(3), 99, 1234567890123ll, 0xabcdull}; }

using namespace codec_testing;

TEST(Codec, PoolRegistrationRoundTrip) {
  const auto m = sample_registration();
  const auto d = round_trip(m);
  EXPECT_EQ(d.sender, m.sender);
  EXPECT_EQ(d.incarnation, m.incarnation);
  EXPECT_EQ(d.peer_incarnation, m.peer_incarnation);
  EXPECT_EQ(d.control_endpoint, m.control_endpoint);
  EXPECT_EQ(d.worker_address, m.worker_address);
  ASSERT_EQ(d.spans.size(), 2u);
  EXPECT_EQ(d.spans[0].offset, 0u);
  EXPECT_EQ(d.spans[0].bytes, 1ull << 40);
  EXPECT_EQ(d.spans[0].base, 0x7f00'1234'5678'9abcull);
  EXPECT_EQ(d.spans[0].packed_rkey, m.spans[0].packed_rkey);
  EXPECT_EQ(d.spans[1].offset, 1ull << 41);
  EXPECT_EQ(d.spans[1].packed_rkey, "k2");
  EXPECT_EQ(d.page_size, 16u);
  EXPECT_EQ(d.page_bytes, 65536u);
  EXPECT_EQ(d.num_pages, 12345u);
  EXPECT_EQ(d.kv_offsets, m.kv_offsets);
  EXPECT_EQ(d.aux_offsets, m.aux_offsets);
  EXPECT_EQ(d.aux_item_bytes, (std::vector<uint64_t>{8, 4}));
  EXPECT_EQ(d.aux_rows, 256u);
  EXPECT_EQ(d.state_offsets, m.state_offsets);
  EXPECT_EQ(d.state_item_bytes, (std::vector<uint64_t>{16}));
  EXPECT_EQ(d.state_rows, 200u);
  EXPECT_EQ(d.guard_offset, m.guard_offset);
  EXPECT_EQ(d.heads_per_rank, 4u);
  EXPECT_EQ(d.first_head, 8u);
}

TEST(Codec, PoolRegistrationMinimal) {
  const auto m = minimal_registration();
  const auto d = round_trip(m);
  EXPECT_EQ(d.control_endpoint, "");
  EXPECT_EQ(d.spans[0].packed_rkey, "");
  EXPECT_TRUE(d.aux_offsets.empty());
  EXPECT_TRUE(d.state_offsets.empty());
  // rank 13 | compat count (empty) | 2 incarnations | 2 strings | span count + one span (3 u64 + empty str) | page_size | page_bytes,
  // num_pages | kv_offsets (count + 1) | aux, aux item (2 counts) | aux_rows | state, state item
  // (2 counts) | state_rows | guard_offset | heads, first_head
  EXPECT_EQ(encode(Message(m)).size(), 12u + 13 + 4 + 16 + 2 * 4 + 4 + 3 * 8 + 4 + 4 + 2 * 8 + (4 + 8) + 2 * 4 + 8 + 2 * 4 +
                                           8 + 8 + 2 * 4);
}

// Re-encodes `m` after `edit` and expects decode() to name `field`.
template <typename Edit>
void expect_registration_rejected(Edit edit, const std::string& field) {
  PoolRegistration m = sample_registration();
  edit(m);
  expect_rejected(encode(Message(m)), field);
}

TEST(CodecReject, RegistrationFields) {
  expect_registration_rejected([](PoolRegistration& m) { m.spans.clear(); }, "PoolRegistration.spans");
  expect_registration_rejected([](PoolRegistration& m) { m.spans[1].bytes = 0; }, "PoolRegistration.spans.bytes");
  expect_registration_rejected([](PoolRegistration& m) { m.spans[1].offset = UINT64_MAX - 10; }, "overflows");
  expect_registration_rejected([](PoolRegistration& m) { m.page_size = 0; }, "PoolRegistration.page_size");
  expect_registration_rejected([](PoolRegistration& m) { m.page_bytes = 0; }, "PoolRegistration.page_bytes");
  expect_registration_rejected([](PoolRegistration& m) { m.num_pages = 0; }, "PoolRegistration.num_pages");
  expect_registration_rejected([](PoolRegistration& m) { m.kv_offsets.clear(); }, "no KV buffer");
  expect_registration_rejected([](PoolRegistration& m) { m.kv_offsets.resize(kMaxKvBuffers + 1); },
                               "PoolRegistration.kv_offsets");
  expect_registration_rejected([](PoolRegistration& m) { m.aux_offsets.resize(kMaxAuxBuffers + 1); },
                               "PoolRegistration.aux_offsets");
  expect_registration_rejected([](PoolRegistration& m) { m.aux_item_bytes.pop_back(); },
                               "1 entries for 2 aux buffers");
  expect_registration_rejected([](PoolRegistration& m) { m.aux_item_bytes[1] = 0; }, "entry 1 is 0");
  expect_registration_rejected([](PoolRegistration& m) { m.aux_rows = 0; }, "PoolRegistration.aux_rows");
  expect_registration_rejected([](PoolRegistration& m) { m.state_item_bytes.push_back(8); },
                               "2 entries for 1 state buffers");
  expect_registration_rejected([](PoolRegistration& m) { m.state_rows = 0; }, "PoolRegistration.state_rows");
  expect_registration_rejected([](PoolRegistration& m) { m.heads_per_rank = 0; },
                               "PoolRegistration.heads_per_rank");
  expect_registration_rejected([](PoolRegistration& m) { m.first_head = UINT32_MAX - 2; },
                               "first_head + heads_per_rank overflows");
}

TEST(CodecReject, SpanCountTheBodyCannotHold) {
  std::string f = encode(Message(minimal_registration()));
  const size_t count_off = 12 + 13 + 4 + 16 + 4 + 4;  // after rank, empty compat, incarnations, two empty strings
  put_le(f, count_off, kMaxRegionSpans, 4);
  expect_rejected(f, "do not fit the body");
  put_le(f, count_off, kMaxRegionSpans + 1, 4);
  expect_rejected(f, "expected 1..");
}

TEST(Codec, StateRowsMayBeZeroWithoutStateBuffers) {
  PoolRegistration m = sample_registration();
  m.state_offsets.clear();
  m.state_item_bytes.clear();
  m.state_rows = 0;
  EXPECT_EQ(round_trip(m).state_rows, 0u);
}

TEST(Codec, RoomMetadataRoundTrip) {
  const auto m = sample_metadata(5);
  const auto d = round_trip(m);
  EXPECT_EQ(d.room, m.room);
  EXPECT_EQ(d.sender, m.sender);
  EXPECT_EQ(d.incarnation, 7u);
  EXPECT_EQ(d.peer_incarnation, 1ull << 63);
  EXPECT_EQ(d.kv_indices, m.kv_indices);
  EXPECT_EQ(d.aux_index, 17u);
  EXPECT_EQ(d.state_indices, (std::vector<uint64_t>{3, 1ull << 33}));
  EXPECT_EQ(d.expected_senders, 2u);
}

TEST(CodecReject, StateIndicesCount) {
  RoomMetadata m = sample_metadata(1);
  m.state_indices.assign(kMaxStateIndices + 1, 0);
  expect_rejected(encode(Message(m)), "RoomMetadata.state_indices");
}

TEST(Codec, RoomMetadataEmptyAndLargeIndices) {
  EXPECT_TRUE(round_trip(sample_metadata(0)).kv_indices.empty());
  const auto big = sample_metadata(1 << 20);
  const auto d = round_trip(big);
  ASSERT_EQ(d.kv_indices.size(), size_t{1} << 20);
  EXPECT_EQ(d.kv_indices, big.kv_indices);
  EXPECT_EQ(encode(Message(big)).size(), 12u + 8 + 13 + 16 + 4 + 8 * (size_t{1} << 20) + 8 + 4 + 2 * 8 + 4);
}

TEST(Codec, RoomStatusRoundTrip) {
  const auto m = sample_status();
  const auto d = round_trip(m);
  EXPECT_EQ(d.room, 42u);
  EXPECT_EQ(d.sender, m.sender);
  EXPECT_EQ(d.incarnation, m.incarnation);
  EXPECT_EQ(d.peer_incarnation, 5u);
  EXPECT_EQ(d.state, KVPoll::Failed);
  EXPECT_EQ(d.failure.code, ErrorCode::kTransferError);
  EXPECT_EQ(d.failure.origin, m.failure.origin);
  EXPECT_EQ(d.failure.first_seen_ns, -5);
  EXPECT_EQ(d.failure.wall_ns, m.failure.wall_ns);
  EXPECT_EQ(d.failure.reason, m.failure.reason);
  EXPECT_EQ(d.failure, m.failure);

  RoomStatus ok;
  ok.incarnation = 1;
  ok.state = KVPoll::Success;
  ok.failure.code = ErrorCode::kOk;
  const auto d2 = round_trip(ok);
  EXPECT_EQ(d2.state, KVPoll::Success);
  EXPECT_EQ(d2.failure.reason, "");
}

TEST(Codec, RoomStatusNotTerminalRoundTrip) {
  RoomStatus m = sample_status();
  EXPECT_TRUE(round_trip(m).terminal);  // the default: terminal, no flags byte
  const size_t terminal_bytes = encode(Message(m)).size();
  m.terminal = false;
  const auto d = round_trip(m);
  EXPECT_FALSE(d.terminal);
  EXPECT_EQ(d.state, KVPoll::Failed);
  EXPECT_EQ(d.failure.code, ErrorCode::kTransferError);
  EXPECT_EQ(d.failure.origin, m.failure.origin);
  EXPECT_EQ(d.failure.reason, m.failure.reason);
  EXPECT_EQ(encode(Message(m)).size(), terminal_bytes + 1);  // one trailing flags byte
}

TEST(Codec, RoomStatusEveryFailureCode) {
  for (int c = 1; c <= kMaxErrorCode; ++c) {
    if (!code_from_int(c)) continue;  // a reserved value
    RoomStatus m = sample_status();
    m.failure.code = static_cast<ErrorCode>(c);
    EXPECT_EQ(static_cast<int>(round_trip(m).failure.code), c);
  }
}

TEST(Codec, OverlongReasonIsTruncatedNotRejected) {
  RoomStatus m = sample_status();
  m.failure.reason = std::string(kMaxStringBytes + 100, 'r');
  auto r = decode(encode(Message(m)));
  ASSERT_TRUE(r.ok()) << r.status().str();
  EXPECT_EQ(std::get<RoomStatus>(*r).failure.reason.size(), kMaxStringBytes);
}

TEST(Codec, HeartbeatRoundTrip) {
  const auto d = round_trip(sample_heartbeat());
  EXPECT_EQ(d.sender, prefill(3));
  EXPECT_EQ(d.incarnation, 0xabcdu);
  EXPECT_EQ(d.seq, 99u);
  EXPECT_EQ(d.sent_ns, 1234567890123ll);
  EXPECT_EQ(d.challenge, 0u);
  EXPECT_EQ(d.answer, 0u);
}

// The optional tail (docs/security.md, "Incarnations"): a challenge or its answer, never a bad
// probe kind, a zero nonce or a cut tail.
TEST(Codec, HeartbeatCarriesAChallengeOrItsAnswer) {
  Heartbeat hb = sample_heartbeat();
  hb.challenge = 0x1122334455667788ull;
  EXPECT_EQ(round_trip(hb).challenge, hb.challenge);
  EXPECT_EQ(round_trip(hb).answer, 0u);
  hb.challenge = 0;
  hb.answer = 42;
  EXPECT_EQ(round_trip(hb).answer, 42u);
  EXPECT_EQ(round_trip(hb).challenge, 0u);
  std::string f = encode(Message(hb));
  ASSERT_EQ(f.size(), 12u + 37 + 9);
  expect_rejected(f.substr(0, f.size() - 1).replace(8, 1, 1, char(45)), "Heartbeat.nonce");
  f[12 + 37] = 9;  // 3 and 4 are the renewal and leaving tags (codec_renewal_test.cc)
  expect_rejected(f, "Heartbeat.probe");
  f[12 + 37] = 1;
  f.replace(12 + 38, 8, 8, '\0');
  expect_rejected(f, "Heartbeat.nonce");
}

TEST(Codec, HeaderLayoutIsLittleEndian) {
  const std::string f = encode(Message(sample_heartbeat()));
  ASSERT_EQ(f.size(), 12u + 13 + 8 + 8 + 8);
  EXPECT_EQ(f.substr(0, 4), "KVFY");
  EXPECT_EQ(f[4], 7);  // version 7, low byte first
  EXPECT_EQ(f[5], 0);
  EXPECT_EQ(f[6], 4);  // type Heartbeat
  EXPECT_EQ(f[8], 37);  // body length
  EXPECT_EQ(f[12], 0);  // sender role prefill
  EXPECT_EQ(f[12 + 5], 3);  // sender tp_rank
  EXPECT_EQ(static_cast<uint8_t>(f[12 + 13]), 0xcd);  // incarnation, low byte first
  EXPECT_EQ(f[12 + 13 + 8], 99);  // seq
}

TEST(CodecReject, SenderIncarnationZero) {
  // Every rank has an incarnation (messages.h); the receiver's may be 0 (not known yet).
  PoolRegistration reg = sample_registration();
  reg.peer_incarnation = 0;
  EXPECT_EQ(round_trip(reg).peer_incarnation, 0u);
  reg.incarnation = 0;
  expect_rejected(encode(Message(reg)), "PoolRegistration.incarnation");
  RoomMetadata md = sample_metadata(1);
  md.incarnation = 0;
  expect_rejected(encode(Message(md)), "RoomMetadata.incarnation");
  RoomStatus st = sample_status();
  st.incarnation = 0;
  expect_rejected(encode(Message(st)), "RoomStatus.incarnation");
  Heartbeat hb = sample_heartbeat();
  hb.incarnation = 0;
  expect_rejected(encode(Message(hb)), "Heartbeat.incarnation");
}

TEST(Codec, RegistrationRefusalRoundTripAndNeedsACause) {
  RegistrationRefusal m{prefill(2), sample_status().failure, 0x1234, 0x99};
  m.failure.code = ErrorCode::kProtocolError;
  m.failure.origin = prefill(2);
  const auto d = round_trip(m);
  EXPECT_EQ(d.sender, m.sender);
  EXPECT_EQ(d.failure, m.failure);
  EXPECT_EQ(d.incarnation, 0x1234u);
  EXPECT_EQ(d.peer_incarnation, 0x99u);
  RegistrationRefusal no_inc = m;
  no_inc.incarnation = 0;
  expect_rejected(encode(Message(no_inc)), "RegistrationRefusal.incarnation");
  EXPECT_EQ(message_name(Message(m)), "RegistrationRefusal");
  RegistrationRefusal ok = m;
  ok.failure.code = ErrorCode::kOk;
  expect_rejected(encode(Message(ok)), "RegistrationRefusal.code");
  std::string f = encode(Message(m));
  f.pop_back();
  fix_body_length(f);
  expect_rejected(f, "RegistrationRefusal.reason");
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
  put_le(g, 4, 2, 2);  // version 2: RoomStatus without the failure's wall_ns
  expect_rejected(g, "version");
  g = f;
  put_le(g, 4, 1, 2);  // version 1: before engine-shaped memory
  expect_rejected(g, "version");
  g = f;
  put_le(g, 4, 3, 2);  // version 3: messages without incarnations
  expect_rejected(g, "version");
  g = f;
  put_le(g, 4, 4, 2);  // version 4: registrations without the compatibility fingerprint
  expect_rejected(g, "version");
  g = f;
  put_le(g, 4, 5, 2);  // version 5: heartbeats without lease renewals
  expect_rejected(g, "version");
  g = f;
  put_le(g, 4, 6, 2);  // version 6: heartbeats without the leaving tag
  expect_rejected(g, "version");
  g = f;
  put_le(g, 4, 8, 2);
  expect_rejected(g, "version");
  g = f;
  put_le(g, 4, 0, 2);
  expect_rejected(g, "version");
  g = f;
  put_le(g, 6, 0, 2);
  expect_rejected(g, "type");
  g = f;
  put_le(g, 6, 99, 2);
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
  f.resize(12 + 13 + 4 + 16 + 2);  // rank, empty compat, incarnations
  fix_body_length(f);
  expect_rejected(f, "PoolRegistration.control_endpoint");
}

TEST(CodecReject, StringLengthPastEndAndOverLimit) {
  std::string f = encode(Message(sample_registration()));
  const size_t len_off = 12 + 13 + 4 + 16;  // control_endpoint length (after rank, empty compat, incarnations)
  std::string g = f;
  put_le(g, len_off, f.size(), 4);  // longer than the body, within the limit
  expect_rejected(g, "PoolRegistration.control_endpoint");
  expect_rejected(g, "past the end");
  g = f;
  put_le(g, len_off, kMaxStringBytes + 1, 4);
  expect_rejected(g, "exceeds the limit");

  RoomStatus s = sample_status();
  s.failure.reason = "abc";
  g = encode(Message(s));
  put_le(g, g.size() - 7, 4, 4);  // reason length 4, only 3 bytes follow
  expect_rejected(g, "RoomStatus.reason");
}

TEST(CodecReject, KvIndicesCount) {
  std::string f = encode(Message(sample_metadata(2)));
  const size_t count_off = 12 + 8 + 13 + 16;
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
  const size_t state_off = 12 + 8 + 13 + 16;
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
  ok.incarnation = 1;
  ok.state = KVPoll::Success;
  ok.failure.code = ErrorCode::kOk;
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
  std::string f = encode(Message(sample_metadata(3))) + std::string("\x01\x00", 2);  // flags, then one more
  fix_body_length(f);
  expect_rejected(f, "trailing");
}

// Deterministic fuzz: mutations of valid frames never crash decode, and every frame decode
// accepts re-encodes to exactly the same bytes (the encoding is canonical).
TEST(CodecFuzz, MutatedFramesNeverCrashAndAcceptedOnesAreCanonical) {
  RoomStatus ok_status;
  ok_status.incarnation = 2;
  ok_status.state = KVPoll::Success;
  RoomStatus early_status = sample_status();
  early_status.terminal = false;
  RoomStatus digest_status = ok_status;  // with the integrity fields (codec_integrity_test.cc)
  digest_status.digest = 0x5a5a'0000'ffff'1234ull;
  RoomMetadata integrity_metadata = sample_metadata(5);
  integrity_metadata.integrity = true;
  Heartbeat renewal = sample_heartbeat();  // with renewed rooms (codec_renewal_test.cc)
  renewal.renew_rooms = {7, 8, 9};
  renewal.challenge = 3;
  const std::vector<std::string> seeds = {
      encode(Message(sample_registration())), encode(Message(minimal_registration())),
      encode(Message(sample_metadata(0))),    encode(Message(sample_metadata(40))),
      encode(Message(sample_status())),       encode(Message(ok_status)),
      encode(Message(sample_heartbeat())),    encode(Message(early_status)),
      encode(Message(digest_status)),         encode(Message(integrity_metadata)),
      encode(Message(renewal)),
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
