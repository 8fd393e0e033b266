// The staged path's ring on the host implementation of the seam: a room's scattered device pages
// gathered into bounded pinned slots on "prefill", carried over a stand-in for the network, and
// scattered into other pages on "decode".
#include "device/staging_ring.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "device/host_device_copy.h"

namespace kvferry::device {
namespace {

constexpr uint64_t kPage = 512;
constexpr uint64_t kPages = 32;

uint8_t* at(uint64_t a) { return reinterpret_cast<uint8_t*>(a); }

struct Side {
  explicit Side(bool manual) : seam({.devices = 1, .manual = manual}) {}
  HostDeviceCopy seam;
  uint64_t pool = 0;
  std::unique_ptr<StagingRing> ring;
  void init(uint32_t slots, uint32_t pages_per_slot) {
    pool = seam.alloc_device(0, kPage * kPages).value();
    auto r = StagingRing::create(seam, 0, 1, kPage * pages_per_slot, slots);
    ASSERT_TRUE(r.ok()) << r.status().str();
    ring = std::move(r).value();
  }
  std::vector<DevicePiece> pieces(const std::vector<uint64_t>& pages) const {
    std::vector<DevicePiece> out;
    for (uint64_t p : pages) out.push_back({pool + p * kPage, kPage});
    return out;
  }
};

std::vector<uint64_t> scattered(uint64_t n, uint32_t seed) {
  std::vector<uint64_t> v(kPages);
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  v.resize(n);
  return v;
}

// 11 pages in chunks of up to 3 through 2 slots per side, the prefill device slow (manual): every
// page lands byte-exact at its decode page, and nothing else is written.
TEST(StagingRing, RoomCrossesThroughBoundedSlots) {
  Side pre(true), dec(false);
  pre.init(2, 3);
  dec.init(2, 3);
  for (uint64_t i = 0; i < kPage * kPages; ++i) at(pre.pool)[i] = static_cast<uint8_t>(i * 37 + i / kPage + 1);
  const std::vector<uint64_t> src = scattered(11, 1), dst = scattered(11, 2);
  size_t next = 0, landed = 0;
  std::vector<std::pair<size_t, size_t>> sent;  // chunk ranges in order of gather
  for (int step = 0; landed < src.size(); ++step) {
    ASSERT_LT(step, 100);
    while (next < src.size()) {  // fill every free slot
      const size_t n = std::min<size_t>(3, src.size() - next);
      auto pieces = pre.pieces({src.begin() + next, src.begin() + next + n});
      auto slot = pre.ring->gather(0x11, pieces);
      ASSERT_TRUE(slot.ok()) << slot.status().str();
      if (!*slot) break;
      sent.push_back({next, n});
      next += n;
    }
    EXPECT_LE(pre.seam.in_flight(), 2u) << "never more chunks than slots";
    pre.seam.run_pending(1);  // the device finishes one batch per step
    auto c = pre.ring->poll();
    ASSERT_TRUE(c.ok());
    if (!*c) continue;
    ASSERT_TRUE((*c)->status.ok());
    EXPECT_EQ((*c)->room, 0x11u);
    const auto [first, n] = sent[landed / 3];
    ASSERT_EQ((*c)->bytes, n * kPage);
    auto in = dec.ring->acquire();  // the network: prefill's slot into one of decode's
    ASSERT_TRUE(in.has_value());
    std::memcpy(dec.ring->slot_memory(*in), pre.ring->slot_memory((*c)->slot), (*c)->bytes);
    ASSERT_TRUE(pre.ring->release((*c)->slot).ok());
    ASSERT_TRUE(dec.ring->scatter(*in, 0x11, dec.pieces({dst.begin() + first, dst.begin() + first + n})).ok());
    auto d = dec.ring->poll();
    ASSERT_TRUE(d.ok() && d->has_value());
    EXPECT_TRUE((*d)->status.ok());
    ASSERT_TRUE(dec.ring->release((*d)->slot).ok());
    landed += n;
  }
  for (size_t i = 0; i < src.size(); ++i)
    EXPECT_EQ(std::memcmp(at(pre.pool) + src[i] * kPage, at(dec.pool) + dst[i] * kPage, kPage), 0) << i;
  for (uint64_t p = 0; p < kPages; ++p)
    if (std::find(dst.begin(), dst.end(), p) == dst.end()) {
      EXPECT_TRUE(std::all_of(at(dec.pool) + p * kPage, at(dec.pool) + (p + 1) * kPage,
                              [](uint8_t b) { return b == 0; }))
          << "page " << p << " was written";
    }
  EXPECT_EQ(pre.ring->free_slots(), 2u);
  EXPECT_EQ(dec.ring->free_slots(), 2u);
}

// Chunks come out in the order they were queued (a room's order), a slot is busy until released,
// and a failed chunk comes out with its error and room.
TEST(StagingRing, OrderBoundsAndFailures) {
  Side s(true);
  s.init(3, 2);
  s.seam.fail_batch(2, "device lost");
  ASSERT_TRUE(s.ring->gather(0xa, s.pieces({1, 2})).value().has_value());
  ASSERT_TRUE(s.ring->gather(0xb, s.pieces({3})).value().has_value());
  ASSERT_TRUE(s.ring->gather(0xa, s.pieces({4, 5})).value().has_value());
  EXPECT_FALSE(s.ring->gather(0xc, s.pieces({6})).value().has_value()) << "no free slot: back-pressure";
  EXPECT_FALSE(s.ring->poll().value().has_value()) << "nothing is handed out before its copies complete";
  s.seam.run_pending();
  std::vector<uint64_t> rooms;
  for (int i = 0; i < 3; ++i) {
    auto c = s.ring->poll();
    ASSERT_TRUE(c.ok() && c->has_value());
    rooms.push_back((*c)->room);
    if (i == 1) {
      EXPECT_EQ((*c)->status.code(), ErrorCode::kTransferError);
      EXPECT_NE((*c)->status.message().find("device lost"), std::string::npos);
    } else {
      EXPECT_TRUE((*c)->status.ok());
    }
    if (i == 0) {
      EXPECT_FALSE(s.ring->gather(0xc, s.pieces({6})).value().has_value()) << "handed out is still busy";
    }
    EXPECT_TRUE(s.ring->release((*c)->slot).ok());
    EXPECT_FALSE(s.ring->release((*c)->slot).ok()) << "twice";
  }
  EXPECT_EQ(rooms, (std::vector<uint64_t>{0xa, 0xb, 0xa}));
  EXPECT_FALSE(s.ring->poll().value().has_value());
  EXPECT_EQ(s.ring->free_slots(), 3u);
}

TEST(StagingRing, Refusals) {
  Side s(false);
  s.init(2, 2);
  auto too_big = s.ring->gather(1, s.pieces({1, 2, 3}));
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("piece 2 overflows the slot of 1024 bytes"), std::string::npos);
  EXPECT_EQ(s.ring->free_slots(), 2u) << "a refused chunk takes no slot";
  EXPECT_FALSE(s.ring->gather(1, {}).ok());
  EXPECT_FALSE(s.ring->scatter(0, 1, s.pieces({1})).ok()) << "slot 0 was not acquired";
  s.seam.fail_next_enqueue(Status(ErrorCode::kResourceExhausted, "no stream"));
  EXPECT_EQ(s.ring->gather(1, s.pieces({1})).status().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(s.ring->free_slots(), 2u);

  HostDeviceCopy none({.devices = 0});
  EXPECT_NE(StagingRing::create(none, 0, 0, 4096, 2).status().message().find("no CUDA device"), std::string::npos);
  HostDeviceCopy one;
  EXPECT_FALSE(StagingRing::create(one, 0, 0, 4096, 0).ok());
  EXPECT_FALSE(StagingRing::create(one, 0, 0, 4096, kMaxStagingSlots + 1).ok());
  EXPECT_FALSE(StagingRing::create(one, 0, 0, 0, 2).ok());
}

// Tearing a ring down waits out its copies in flight before the slots go.
TEST(StagingRing, DestructionWaitsOutCopiesInFlight) {
  Side s(true);
  s.init(2, 2);
  ASSERT_TRUE(s.ring->gather(1, s.pieces({1, 2})).value().has_value());
  EXPECT_EQ(s.seam.in_flight(), 1u);
  s.ring.reset();
  EXPECT_EQ(s.seam.in_flight(), 0u);
}

}  // namespace
}  // namespace kvferry::device
