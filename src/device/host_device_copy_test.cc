#include "device/host_device_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace kvferry::device {
namespace {

uint8_t* at(uint64_t a) { return reinterpret_cast<uint8_t*>(a); }

std::string refusal(const Status& s) { return s.ok() ? "accepted" : s.message(); }

// Pages of a "device" pool scattered from a pinned staging buffer and back, byte for byte.
TEST(HostDeviceCopy, ScatteredBatchesAreByteExact) {
  HostDeviceCopy d({.devices = 2});
  constexpr uint64_t kPage = 4096, kPages = 64;
  auto pool = d.alloc_device(1, kPage * kPages);
  auto staging = d.alloc_pinned(kPage * kPages);
  auto back = d.alloc_pinned(kPage * kPages);
  ASSERT_TRUE(pool.ok() && staging.ok() && back.ok());
  for (uint64_t i = 0; i < kPage * kPages; ++i) at(*staging)[i] = static_cast<uint8_t>(i * 31 + i / kPage);

  std::vector<uint64_t> dst_page(kPages / 2);  // half the pages, in a scattered order
  std::iota(dst_page.begin(), dst_page.end(), 0);
  std::shuffle(dst_page.begin(), dst_page.end(), std::mt19937(7));
  for (uint64_t& p : dst_page) p = p * 2 + 1;
  std::vector<CopyRun> in, out;
  for (uint64_t i = 0; i < dst_page.size(); ++i) {
    in.push_back({*staging + i * kPage, *pool + dst_page[i] * kPage, kPage});
    out.push_back({*pool + dst_page[i] * kPage, *back + i * kPage, kPage});
  }
  auto t1 = d.copy_batch(1, 0, in);
  ASSERT_TRUE(t1.ok()) << t1.status().str();
  auto t2 = d.copy_batch(1, 0, out);
  ASSERT_TRUE(t2.ok()) << t2.status().str();
  EXPECT_TRUE(d.wait(*t2).ok());
  EXPECT_EQ(d.query(*t1).value(), true);
  EXPECT_EQ(std::memcmp(at(*staging), at(*back), dst_page.size() * kPage), 0);
  for (uint64_t p = 0; p < kPages; p += 2)  // pages no run names stay untouched
    for (uint64_t i = 0; i < kPage; ++i) ASSERT_EQ(at(*pool)[p * kPage + i], 0) << p;
  auto info = d.classify(*pool + 5 * kPage + 3);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->kind, PointerKind::kDevice);
  EXPECT_EQ(info->device, 1);
  EXPECT_EQ(d.classify(*staging)->kind, PointerKind::kPinned);
  uint64_t stack = 0;
  EXPECT_EQ(d.classify(reinterpret_cast<uint64_t>(&stack))->kind, PointerKind::kPageable);
  EXPECT_TRUE(d.retire(*t1).ok());
  EXPECT_TRUE(d.retire(*t2).ok());
  EXPECT_TRUE(d.free_device(*pool).ok());
  EXPECT_FALSE(d.free_device(*pool).ok());  // twice
  EXPECT_FALSE(d.free_device(*staging).ok());  // pinned, not device
}

// Manual mode: nothing is copied until the "device" runs it; a stream completes in order, and
// waiting on one stream does not run another.
TEST(HostDeviceCopy, CompletionKeepsStreamOrder) {
  HostDeviceCopy d({.devices = 1, .manual = true});
  auto src = d.alloc_pinned(4 * 256);
  auto dst = d.alloc_device(0, 4 * 256);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::memset(at(*src), 0x5a, 4 * 256);
  std::vector<CopyTicket> t;
  for (uint64_t i = 0; i < 4; ++i) {
    const CopyRun r{*src + i * 256, *dst + i * 256, 256};
    auto k = d.copy_batch(0, i == 3 ? 1 : 0, std::span(&r, 1));
    ASSERT_TRUE(k.ok());
    t.push_back(*k);
  }
  for (CopyTicket k : t) EXPECT_EQ(d.query(k).value(), false);
  EXPECT_EQ(at(*dst)[0], 0);
  EXPECT_FALSE(d.retire(t[0]).ok()) << "a batch in flight is never forgotten";
  EXPECT_NE(refusal(d.free_device(*dst)).find("in flight"), std::string::npos);

  EXPECT_TRUE(d.wait(t[3]).ok());  // stream 1 only
  EXPECT_EQ(at(*dst)[3 * 256], 0x5a);
  EXPECT_EQ(d.query(t[0]).value(), false);
  EXPECT_EQ(d.in_flight(), 3u);

  EXPECT_EQ(d.run_pending(1), 1u);
  EXPECT_EQ(d.query(t[0]).value(), true);
  EXPECT_EQ(d.query(t[1]).value(), false);
  EXPECT_EQ(at(*dst)[256], 0);
  EXPECT_TRUE(d.wait(t[2]).ok());  // runs t[1] first: stream order
  EXPECT_EQ(d.query(t[1]).value(), true);
  EXPECT_EQ(std::memcmp(at(*src), at(*dst), 4 * 256), 0);
  EXPECT_EQ(d.in_flight(), 0u);
}

TEST(HostDeviceCopy, InjectedFaultsFailTheirBatchOnly) {
  HostDeviceCopy d({.devices = 1});
  auto src = d.alloc_pinned(3 * 64);
  auto dst = d.alloc_device(0, 3 * 64);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::memset(at(*src), 1, 3 * 64);
  const std::vector<CopyRun> runs{{*src, *dst, 64}, {*src + 64, *dst + 64, 64}, {*src + 128, *dst + 128, 64}};
  d.fail_batch(2, "uncorrectable ECC error", 1);
  auto a = d.copy_batch(0, 0, std::span(runs).first(1));
  auto b = d.copy_batch(0, 0, std::span(runs).subspan(1));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(d.query(*a).value(), true);
  auto q = d.query(*b);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), ErrorCode::kTransferError);
  EXPECT_NE(q.status().message().find("uncorrectable ECC error"), std::string::npos);
  EXPECT_EQ(d.query(*b).status().message(), q.status().message()) << "asking again, the same answer";
  EXPECT_EQ(d.wait(*b).code(), ErrorCode::kTransferError);
  EXPECT_EQ(at(*dst)[64], 1) << "the failed batch's first run was copied";
  EXPECT_EQ(at(*dst)[128], 0) << "its second was not";
  EXPECT_TRUE(d.retire(*b).ok()) << "a failed batch is complete: nothing of it is in flight";
  EXPECT_NE(refusal(d.retire(*b)).find("unknown copy ticket"), std::string::npos);

  d.fail_next_enqueue(Status(ErrorCode::kResourceExhausted, "no stream"));
  const uint64_t before = d.batches_enqueued();
  EXPECT_EQ(d.copy_batch(0, 0, runs).status().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(d.batches_enqueued(), before);
  auto c = d.copy_batch(0, 0, runs);  // the fault was used once
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(d.wait(*c).ok());
}

TEST(HostDeviceCopy, RefusesBadBatches) {
  HostDeviceCopy d({.devices = 1});
  constexpr uint64_t kDev = 1 << 20;  // its own mapping, far from the pinned heap block
  auto dev = d.alloc_device(0, kDev);
  auto host = d.alloc_pinned(1024);
  ASSERT_TRUE(dev.ok() && host.ok());
  auto why = [&](std::vector<CopyRun> runs, int32_t ordinal = 0, uint32_t stream = 0) {
    auto r = d.copy_batch(ordinal, stream, runs);
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  EXPECT_NE(why({}).find("no runs"), std::string::npos);
  EXPECT_NE(why({{0, *dev, 8}}).find("run 0: null address"), std::string::npos);
  EXPECT_NE(why({{*host, *dev, 8}, {*host, *dev + 8, 0}}).find("run 1: zero bytes"), std::string::npos);
  EXPECT_NE(why({{*dev, *dev + 4, 8}}).find("overlaps"), std::string::npos);
  EXPECT_NE(why({{UINT64_MAX - 4, *dev, 8}}).find("wraps"), std::string::npos);
  EXPECT_NE(why({{*host, *dev + kDev - 24, 100}}).find("destination runs past the end of its device allocation"),
            std::string::npos);
  EXPECT_NE(why({{*host, *dev, 8}}, 1).find("cuda device 1: no such device"), std::string::npos);
  EXPECT_NE(why({{*host, *dev, 8}}, 0, kMaxStreams).find("stream 8"), std::string::npos);
  EXPECT_EQ(d.batches_enqueued(), 0u);
  EXPECT_EQ(why({{*host, *dev, 8}}), "accepted");
}

TEST(HostDeviceCopy, TicketsAreBounded) {
  HostDeviceCopy d({.devices = 1, .manual = true});
  auto src = d.alloc_pinned(64);
  auto dst = d.alloc_device(0, 64);
  ASSERT_TRUE(src.ok() && dst.ok());
  const CopyRun r{*src, *dst, 64};
  for (size_t i = 0; i < kMaxTicketsInFlight; ++i) ASSERT_TRUE(d.copy_batch(0, 0, std::span(&r, 1)).ok()) << i;
  EXPECT_EQ(d.copy_batch(0, 0, std::span(&r, 1)).status().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(d.run_pending(), kMaxTicketsInFlight);
  EXPECT_TRUE(d.retire(CopyTicket{1}).ok());
  EXPECT_TRUE(d.copy_batch(0, 0, std::span(&r, 1)).ok());
}

// A machine without a GPU, or without a driver: every device call is a refusal naming the device.
TEST(HostDeviceCopy, NoDeviceIsARefusal) {
  HostDeviceCopy none({.devices = 0});
  auto a = none.alloc_device(0, 64);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(a.status().message(), "cuda device 0: this machine has no CUDA device");

  HostDeviceCopy no_driver({.count_error = Status(ErrorCode::kInternal, "cudaErrorInsufficientDriver")});
  Status s = no_driver.check_device(0);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cuda device 0: no usable CUDA device (cudaErrorInsufficientDriver)"), std::string::npos);
  EXPECT_NE(refusal(HostDeviceCopy().check_device(-1)).find("not a device ordinal"), std::string::npos);
  EXPECT_TRUE(HostDeviceCopy().check_device(0).ok());
}

}  // namespace
}  // namespace kvferry::device
