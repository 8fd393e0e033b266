// The CUDA side of the seam, as far as this machine lets it run. Without a GPU or a driver (CI,
// the build machine) opening it is a clean refusal, the same every time, never an abort. With a
// GPU (make test-gpu, not run yet: docs/gpu.md) the same test copies scattered pages for real.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "device/device_copy.h"

namespace kvferry::device {
namespace {

TEST(CudaDeviceCopy, OpensOrRefusesCleanly) {
  auto a = open_cuda_device_copy();
  auto b = open_cuda_device_copy();
  ASSERT_EQ(a.ok(), b.ok()) << "the answer does not change";
  if (!built_with_cuda()) {
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("built without CUDA (KVFERRY_CUDA=OFF"), std::string::npos);
    return;
  }
  if (!a.ok()) {
    EXPECT_EQ(a.status().code(), ErrorCode::kInvalidArgument);
    const std::string m = a.status().message();
    EXPECT_TRUE(m.find("no usable CUDA device (cudaGetDeviceCount: cuda") != std::string::npos ||
                m == "cuda device memory: this machine has no CUDA device")
        << m;
    EXPECT_EQ(b.status().message(), m);
    GTEST_SKIP() << "no GPU here: " << m;
  }
  // A GPU: scattered pages host -> device -> host, byte-exact.
  DeviceCopy& d = **a;
  EXPECT_EQ(d.name(), "cuda");
  ASSERT_TRUE(d.check_device(0).ok());
  EXPECT_FALSE(d.check_device(*d.device_count()).ok());
  constexpr uint64_t kPage = 4096, kPages = 16;
  auto dev = d.alloc_device(0, kPage * kPages);
  auto src = d.alloc_pinned(kPage * kPages);
  auto dst = d.alloc_pinned(kPage * kPages);
  ASSERT_TRUE(dev.ok() && src.ok() && dst.ok());
  EXPECT_EQ(d.classify(*dev)->kind, PointerKind::kDevice);
  EXPECT_EQ(d.classify(*src)->kind, PointerKind::kPinned);
  auto* s = reinterpret_cast<uint8_t*>(*src);
  for (uint64_t i = 0; i < kPage * kPages; ++i) s[i] = static_cast<uint8_t>(i * 13 + 5);
  std::vector<CopyRun> in, out;
  for (uint64_t i = 0; i < kPages; ++i) {
    const uint64_t p = (i * 5) % kPages;
    in.push_back({*src + i * kPage, *dev + p * kPage, kPage});
    out.push_back({*dev + p * kPage, *dst + i * kPage, kPage});
  }
  auto t1 = d.copy_batch(0, 0, in);
  ASSERT_TRUE(t1.ok()) << t1.status().str();
  auto t2 = d.copy_batch(0, 0, out);
  ASSERT_TRUE(t2.ok()) << t2.status().str();
  ASSERT_TRUE(d.wait(*t2).ok());
  EXPECT_EQ(d.query(*t1).value(), true);
  EXPECT_EQ(std::memcmp(s, reinterpret_cast<uint8_t*>(*dst), kPage * kPages), 0);
  auto h = d.export_ipc(0, *dev + kPage, kPage);
  ASSERT_TRUE(h.ok()) << h.status().str();
  EXPECT_EQ(h->offset, kPage);
  EXPECT_TRUE(parse_ipc_handle(encode_ipc_handle(*h)).ok());
  EXPECT_TRUE(d.retire(*t1).ok());
  EXPECT_TRUE(d.retire(*t2).ok());
  EXPECT_TRUE(d.free_device(*dev).ok());
  EXPECT_TRUE(d.free_pinned(*src).ok());
  EXPECT_TRUE(d.free_pinned(*dst).ok());
}

}  // namespace
}  // namespace kvferry::device
