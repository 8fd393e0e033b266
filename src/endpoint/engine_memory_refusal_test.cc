// Engine-shaped memory that does not fit: registrations prefill refuses (with the reason), engine
// buffers the core refuses, decode calls with rows out of range.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "device/host_device_copy.h"
#include "endpoint/engine_pair_test_util.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::EnginePair;
using testing::EnginePairConfig;
using testing::EngineRank;

std::unique_ptr<EnginePair> make(const EnginePairConfig& cfg = {}) { return testing::make_engine_pair(cfg); }

// Tampers with decode rank `d`'s real registration and hands it to prefill rank 0: it must be
// refused, with a reason that mentions `why`, and the peer it had stays as it was.
void expect_refused(EnginePair& p, uint32_t d, const std::function<void(PoolRegistration&)>& edit,
                    const std::string& why) {
  PrefillEndpoint& pre = *p.p().prefill;
  PoolRegistration reg = EnginePair::registration_of(p.d(d));
  EXPECT_EQ(pre.check_registration(reg), "");
  edit(reg);
  // Incarnation 0 (built in this process): the shape checks, not the rule that one incarnation
  // cannot register another pool (issue 31), are what is tested here.
  reg.incarnation = 0;
  if (!pre.in_plan(reg.sender)) {  // refused before decoding since issue 31; the shape check still says why
    EXPECT_NE(pre.check_registration(reg).find(why), std::string::npos) << pre.check_registration(reg);
    return;
  }
  const uint64_t before = pre.refused_registrations();
  const size_t peers = pre.peers();
  pre.on_message(Message(reg));
  EXPECT_EQ(pre.refused_registrations(), before + 1) << why;
  EXPECT_NE(pre.last_refusal().find(why), std::string::npos) << pre.last_refusal();
  EXPECT_EQ(pre.peers(), peers);
}

TEST(EngineMemoryRefusal, RegistrationsThatDoNotFitOurShape) {
  auto p = make();
  ASSERT_TRUE(p);
  using R = PoolRegistration;
  expect_refused(*p, 0, [](R& r) { r.sender.role = Role::kPrefill; }, "not a decode rank");
  expect_refused(*p, 0, [](R& r) { r.page_size = 8; }, "page_size 8 != ours 4");
  expect_refused(*p, 0, [](R& r) { r.kv_offsets.pop_back(); }, "5 KV buffers != our 6");
  expect_refused(*p, 0, [](R& r) { r.aux_item_bytes[1] = 16; }, "aux buffers of [8, 16] bytes a row != ours [8, 24]");
  expect_refused(*p, 0, [](R& r) { r.aux_item_bytes.pop_back(); r.aux_offsets.pop_back(); }, "aux buffers of [8]");
  expect_refused(*p, 0, [](R& r) { r.state_item_bytes = {}; r.state_offsets = {}; }, "state buffers of []");
  expect_refused(*p, 0, [](R& r) { r.page_bytes *= 2; }, "is not 4 tokens x 4 heads of 32 bytes");
  expect_refused(*p, 0, [](R& r) { r.heads_per_rank = 2; }, "is not 4 tokens x 2 heads");
  expect_refused(*p, 0, [](R& r) { r.first_head = 1; }, "outside the model's 4 KV heads");
  expect_refused(*p, 0, [](R& r) { r.heads_per_rank = 0; }, "outside the model's");
  // Sizes against the registered spans, overflow-safe.
  expect_refused(*p, 0, [](R& r) { r.num_pages += 1; }, "kv buffer");
  expect_refused(*p, 0, [](R& r) { r.num_pages = UINT64_MAX / 2; }, "not inside a registered span");
  expect_refused(*p, 0, [](R& r) { r.kv_offsets[3] = UINT64_MAX - 10; }, "kv buffer 3");
  expect_refused(*p, 0, [](R& r) { r.aux_rows += 1; }, "aux buffer");
  expect_refused(*p, 0, [](R& r) { r.state_rows = 1ull << 62; }, "state buffer 0");
  expect_refused(*p, 0, [](R& r) { r.guard_offset = r.spans.back().offset + r.spans.back().bytes; }, "guard rows");
  expect_refused(*p, 0, [](R& r) { r.spans.push_back(r.spans.front()); }, "overlap");
  expect_refused(*p, 0, [](R& r) { r.spans.clear(); }, "span");
  // The real registration is still accepted afterwards.
  PoolRegistration ok = EnginePair::registration_of(p->d());
  p->p().prefill->on_message(Message(ok));
  EXPECT_EQ(p->p().prefill->peers(), 1u);
}

TEST(EngineMemoryRefusal, HeadsThatDoNotHoldWhatThePlanSends) {
  EnginePairConfig c;
  c.decode_tp = 2;
  auto p = make(c);
  ASSERT_TRUE(p);
  // Decode rank 1 holds heads [2, 4): claiming [0, 2) would make prefill write heads 2..3 below
  // the start of its rows (the u32 subtraction would underflow).
  expect_refused(*p, 1, [](PoolRegistration& r) { r.first_head = 0; }, "do not hold heads [2, +2)");
  expect_refused(*p, 1, [](PoolRegistration& r) { r.first_head = 3; r.heads_per_rank = 1; r.page_bytes /= 2; },
                 "do not hold heads [2, +2)");
}

TEST(EngineMemoryRefusal, MismatchedEnginesAreRefusedEndToEnd) {
  EnginePairConfig c;
  c.decode.aux_item_bytes = {8, 16};
  c.wait_registered = false;
  auto p = make(c);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->pump_until([&] { return p->p().prefill->refused_registrations() >= 1; }, 5s));
  EXPECT_EQ(p->p().prefill->peers(), 0u);
  EXPECT_NE(p->p().prefill->last_refusal().find("aux buffers of [8, 16]"), std::string::npos)
      << p->p().prefill->last_refusal();
}

TEST(EngineMemoryRefusal, CoreRefusesEngineBuffersThatDoNotMatchTheLayout) {
  EngineRank r;
  ASSERT_TRUE(testing::build_rank(r, {}, Role::kDecode, 1, 0, {}).ok());
  auto with = [&](const std::function<void(EndpointConfig&)>& edit) {
    EndpointConfig c;
    c.self = r.self;
    c.layout = r.layout;
    c.buffers = r.buffers;
    c.guard_memory = r.guard;
    edit(c);
    return EndpointCore::create(c).status();
  };
  r.core.reset();  // the arena's buffers are registered again by each attempt
  Status s = with([](EndpointConfig& c) { c.buffers.pop_back(); c.buffers.erase(c.buffers.begin()); });
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("5 kv buffers for a model with 6"), std::string::npos) << s.message();
  s = with([](EndpointConfig& c) {
    for (BufferDesc& b : c.buffers)
      if (b.kind == BufferKind::kKv) b.item_bytes /= 2;
  });
  EXPECT_NE(s.message().find("is not a page of this rank's heads"), std::string::npos) << s.message();
  s = with([](EndpointConfig& c) { c.buffers[1].address = c.buffers[0].address + 8; });
  EXPECT_NE(s.message().find("overlaps"), std::string::npos) << s.message();
  s = with([](EndpointConfig& c) { c.buffers[0].memory = MemoryKind::kCuda; });
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cuda"), std::string::npos) << s.message();
  EXPECT_TRUE(with([](EndpointConfig&) {}).ok());
}

// Device buffers at registration (docs/gpu.md), against the device seam's host implementation:
// no device, a bad ordinal, memory that is not the device's are refused naming the buffer; device
// memory that passes reaches the transport, which refuses it without CUDA support in UCX.
TEST(EngineMemoryRefusal, CoreChecksDeviceBuffersThroughTheSeam) {
  EngineRank r;
  ASSERT_TRUE(testing::build_rank(r, {}, Role::kDecode, 1, 0, {}).ok());
  r.core.reset();
  auto seam = std::make_shared<device::HostDeviceCopy>(device::HostDeviceOptions{.devices = 2});
  auto pool = seam->alloc_device(1, r.buffers[0].bytes);
  ASSERT_TRUE(pool.ok());
  auto with = [&](std::shared_ptr<device::DeviceCopy> d, uint64_t address, int32_t device) {
    EndpointConfig c;
    c.self = r.self;
    c.layout = r.layout;
    c.buffers = r.buffers;
    c.guard_memory = r.guard;
    c.device_copy = std::move(d);
    c.buffers[0].address = address;
    c.buffers[0].memory = MemoryKind::kCuda;
    c.buffers[0].device = device;
    return EndpointCore::create(c).status();
  };
  auto none = std::make_shared<device::HostDeviceCopy>(device::HostDeviceOptions{.devices = 0});
  Status s = with(none, *pool, 1);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "kv buffer 0 (cuda device 1): cuda device 1: this machine has no CUDA device");
  s = with(seam, *pool, 2);
  EXPECT_NE(s.message().find("kv buffer 0 (cuda device 2): cuda device 2: no such device"), std::string::npos)
      << s.message();
  s = with(seam, *pool, 0);
  EXPECT_NE(s.message().find("device memory of cuda device 1, not device memory of cuda device 0"), std::string::npos)
      << s.message();
  s = with(seam, r.buffers[0].address, 1);
  EXPECT_NE(s.message().find("byte 0 is pageable memory"), std::string::npos) << s.message();
  s = with(seam, *pool, 1);  // the device check passes; this UCX has no CUDA transports
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cuda"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("cuda device 1"), std::string::npos) << s.message();
}

TEST(EngineMemoryRefusal, DecodeInitChecksPagesAuxAndStateRows) {
  auto p = make();
  ASSERT_TRUE(p);
  DecodeEndpoint& dec = *p->d().decode;
  dec.add_room(0x71, 8);
  const std::vector<uint64_t> ok_state{3}, bad_state{4}, no_state{};
  auto why = [&](const std::vector<uint64_t>& kv, uint64_t aux, const std::vector<uint64_t>& st) {
    Status s = dec.init(0x71, kv, aux, st);
    return s.code() == ErrorCode::kInvalidArgument ? s.message() : "accepted";
  };
  EXPECT_NE(why({0, 16}, 0, no_state).find("page 16 out of range (16 pages)"), std::string::npos);
  EXPECT_NE(why({0, 1}, 8, no_state).find("aux_index 8 out of range (8 rows)"), std::string::npos);
  EXPECT_NE(why({0, 1}, 0, bad_state).find("state index 4 out of range (4 rows)"), std::string::npos);
  EXPECT_EQ(dec.poll(0x71), KVPoll::Bootstrapping);  // nothing was sent
  EXPECT_TRUE(dec.init(0x71, {0, 1}, 7, ok_state).ok());
  EXPECT_NE(why({0, 1}, 7, ok_state).find("twice"), std::string::npos);
}

TEST(EngineMemoryRefusal, MetadataWithRowsOutOfRangeFailsTheRoom) {
  auto p = make();
  ASSERT_TRUE(p);
  PrefillEndpoint& pre = *p->p().prefill;
  const RankId d = p->d().self;
  ASSERT_TRUE(pre.add_room(0x72, 4, 0).ok());
  ASSERT_TRUE(pre.add_room(0x73, 4, 0).ok());
  pre.on_message(Message(RoomMetadata{0x72, d, {0}, 8, {}, 1}));
  pre.on_message(Message(RoomMetadata{0x73, d, {0}, 1, {4}, 1}));
  for (uint64_t room : {0x72, 0x73}) {
    EXPECT_EQ(pre.poll(room), KVPoll::Failed);
    auto e = p->p().core->registry().get(room);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code, ErrorCode::kProtocolError);
    EXPECT_NE(e->failure_reason.find("out of range"), std::string::npos) << e->failure_reason;
  }
}

// Issue 12: a refused decode rank is told why, once; its rooms for that prefill rank (those
// waiting and those added later) fail with that record, and the prefill rank's rooms for it too:
// one line above debug per engine for the refusal, none per room.
TEST(EngineMemoryRefusal, RefusalIsToldOnceAndFailsTheDecodeRanksRoomsWithIt) {
  EnginePairConfig c;
  c.decode.aux_item_bytes = {8, 16};
  c.wait_registered = false;
  const uint64_t lines0 = lines_above_debug();
  auto p = make(c);
  ASSERT_TRUE(p);
  DecodeEndpoint& dec = *p->d().decode;
  PrefillEndpoint& pre = *p->p().prefill;
  const RankId prefill = p->p().self;
  ASSERT_TRUE(p->pump_until([&] { return dec.refused_peers() == 1; }, 5s));
  EXPECT_EQ(pre.refused_registrations(), 1u);
  EXPECT_EQ(lines_above_debug() - lines0, 2u);  // prefill's refusal, decode's answer to it

  auto check = [&](const std::optional<KVTransferError>& e, const char* side) {
    ASSERT_TRUE(e) << side;
    EXPECT_EQ(e->code, ErrorCode::kProtocolError) << side;
    EXPECT_EQ(e->origin, prefill) << side;
    EXPECT_TRUE(e->is_from_another_rank) << side;
    EXPECT_NE(e->failure_reason.find("aux buffers of [8, 16]"), std::string::npos) << e->failure_reason;
  };
  // Rooms added after the refusal fail at once; init() takes the call and sends nothing.
  for (uint64_t room : {0x81, 0x82, 0x83}) {
    ASSERT_TRUE(pre.add_room(room, 4, 0).ok());
    dec.add_room(room, 4);
    EXPECT_EQ(dec.poll(room), KVPoll::Failed);
    EXPECT_TRUE(dec.init(room, {0}, 1, {}).ok());
    EXPECT_EQ(dec.init(room, {0}, 1, {}).code(), ErrorCode::kInvalidArgument);  // twice
    check(p->d().core->registry().get(room), "decode");
  }
  // The prefill rank's rooms fail with the same record (decode told them its failure).
  ASSERT_TRUE(p->pump_until([&] { return pre.poll(0x81) == KVPoll::Failed && pre.poll(0x82) == KVPoll::Failed &&
                                         pre.poll(0x83) == KVPoll::Failed; }, 5s));
  for (uint64_t room : {0x81, 0x82, 0x83}) check(p->p().core->registry().get(room), "prefill");
  auto d0 = p->d().core->registry().get(0x81);
  auto p0 = p->p().core->registry().get(0x81);
  EXPECT_EQ(d0->first_seen_ns, p0->first_seen_ns);  // one record on both sides
  // Metadata that left before the refusal arrived fails the prefill room with the record too.
  ASSERT_TRUE(pre.add_room(0x84, 4, 0).ok());
  pre.on_message(Message(RoomMetadata{0x84, p->d().self, {0}, 1, {}, 1}));
  EXPECT_EQ(pre.poll(0x84), KVPoll::Failed);
  check(p->p().core->registry().get(0x84), "prefill, metadata before the refusal");
  EXPECT_EQ(lines_above_debug() - lines0, 2u);  // nothing per room
  // A second refusal of the same registration is not logged again.
  dec.on_message(Message(RegistrationRefusal{prefill, d0->failure()}));
  EXPECT_EQ(lines_above_debug() - lines0, 2u);
}

}  // namespace
}  // namespace kvferry
