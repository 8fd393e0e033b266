#include "device/device_buffers.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device/host_device_copy.h"

namespace kvferry::device {
namespace {

std::string why(const std::vector<BufferDesc>& b, DeviceCopy* seam) {
  Status s = check_device_buffers(b, seam);
  if (s.ok()) return "accepted";
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  return s.message();
}

BufferDesc cuda(uint64_t address, uint64_t bytes, int32_t device, BufferKind kind = BufferKind::kKv) {
  return {address, bytes, 1024, kind, MemoryKind::kCuda, device};
}

// A rank with KV on two devices and aux rows in host memory.
TEST(DeviceBuffers, MixedHostAndDeviceBuffersAreAccepted) {
  HostDeviceCopy d({.devices = 2});
  auto k = d.alloc_device(0, 1 << 16);
  auto v = d.alloc_device(1, 1 << 16);
  ASSERT_TRUE(k.ok() && v.ok());
  std::vector<uint8_t> aux(4096);
  const std::vector<BufferDesc> b{cuda(*k, 1 << 16, 0), cuda(*v, 1 << 16, 1),
                                  {reinterpret_cast<uint64_t>(aux.data()), aux.size(), 64, BufferKind::kAux}};
  EXPECT_EQ(why(b, &d), "accepted");
  EXPECT_TRUE(check_buffers(b).ok());
}

// Host buffers only: nothing asks the runtime (this one would refuse everything).
TEST(DeviceBuffers, HostBuffersNeedNoDevice) {
  HostDeviceCopy none({.devices = 0});
  std::vector<uint8_t> m(4096);
  const std::vector<BufferDesc> b{{reinterpret_cast<uint64_t>(m.data()), m.size(), 1024, BufferKind::kKv}};
  EXPECT_EQ(why(b, &none), "accepted");
  EXPECT_EQ(why(b, nullptr), "accepted");
}

TEST(DeviceBuffers, RefusalsNameTheBufferAndDevice) {
  HostDeviceCopy d({.devices = 2});
  auto k = d.alloc_device(0, 1 << 16);
  ASSERT_TRUE(k.ok());
  std::vector<uint8_t> host(1 << 16);
  const uint64_t h = reinterpret_cast<uint64_t>(host.data());

  HostDeviceCopy none({.devices = 0});
  EXPECT_EQ(why({cuda(*k, 4096, 0)}, &none),
            "kv buffer 0 (cuda device 0): cuda device 0: this machine has no CUDA device");
  HostDeviceCopy no_driver({.count_error = Status(ErrorCode::kInternal, "cudaGetDeviceCount: no driver")});
  EXPECT_NE(why({cuda(*k, 4096, 0)}, &no_driver).find("no usable CUDA device (cudaGetDeviceCount: no driver)"),
            std::string::npos);
  EXPECT_NE(why({cuda(*k, 4096, 0), cuda(*k + 8192, 4096, 3)}, &d)
                .find("kv buffer 1 (cuda device 3): cuda device 3: no such device"),
            std::string::npos);
  EXPECT_NE(why({cuda(*k, 4096, 1)}, &d)
                .find("byte 0 is device memory of cuda device 0, not device memory of cuda device 1"),
            std::string::npos);
  EXPECT_NE(why({cuda(h, 4096, 0, BufferKind::kState)}, &d)
                .find("state buffer 0 (cuda device 0): byte 0 is pageable memory"),
            std::string::npos);
  EXPECT_NE(why({cuda(*k, 0, 0)}, &d).find("kv buffer 0 (cuda device 0): empty"), std::string::npos);
  EXPECT_NE(why({cuda(UINT64_MAX - 10, 4096, 0)}, &d).find("wrapping"), std::string::npos);
  EXPECT_NE(why({cuda(*k + 4096, 1 << 16, 0)}, &d).find("byte 65535 is pageable memory"), std::string::npos)
      << "a buffer must end in its device's memory too";
}

// Without a seam: this build's own answer. Built without CUDA, or with it on a machine without a
// GPU (this one), a device buffer is refused naming it; on a GPU machine a pageable address is.
TEST(DeviceBuffers, WithoutASeamThisBuildAnswers) {
  std::vector<uint8_t> m(4096);
  const std::string s = why({cuda(reinterpret_cast<uint64_t>(m.data()), m.size(), 0)}, nullptr);
  EXPECT_EQ(s.rfind("kv buffer 0 (cuda device 0): ", 0), 0u) << s;
  auto opened = open_cuda_device_copy();
  if (!built_with_cuda()) {
    EXPECT_NE(s.find("built without CUDA (KVFERRY_CUDA=OFF"), std::string::npos) << s;
  } else if (!opened.ok()) {
    EXPECT_NE(s.find(opened.status().message()), std::string::npos) << s;
  } else {
    EXPECT_NE(s.find("pageable memory"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace kvferry::device
