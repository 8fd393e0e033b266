#include "device/device_buffers.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

namespace kvferry::device {

Status check_device_buffers(const std::vector<BufferDesc>& buffers, DeviceCopy* seam) {
  const bool any = std::any_of(buffers.begin(), buffers.end(),
                               [](const BufferDesc& b) { return b.memory == MemoryKind::kCuda; });
  if (!any) return Status::Ok();
  std::unique_ptr<DeviceCopy> own;
  Status no_seam;
  if (seam == nullptr) {
    auto opened = open_cuda_device_copy();
    if (opened.ok()) {
      own = std::move(opened).value();
      seam = own.get();
    } else {
      no_seam = opened.status();
    }
  }
  std::array<size_t, 3> index{};  // per BufferKind
  for (const BufferDesc& b : buffers) {
    const size_t i = index[static_cast<size_t>(b.kind) % index.size()]++;
    if (b.memory != MemoryKind::kCuda) continue;
    const std::string name = std::string(buffer_kind_name(b.kind)) + " buffer " + std::to_string(i) +
                             " (cuda device " + std::to_string(b.device) + ")";
    if (b.bytes == 0 || b.address > UINT64_MAX - b.bytes)  // check_buffers' word, kept here too
      return Status(ErrorCode::kInvalidArgument, name + ": empty or wrapping address range");
    if (seam == nullptr) return Status(ErrorCode::kInvalidArgument, name + ": " + no_seam.message());
    if (Status s = seam->check_device(b.device); !s.ok())
      return Status(ErrorCode::kInvalidArgument, name + ": " + s.message());
    for (uint64_t at : {b.address, b.address + b.bytes - 1}) {
      auto info = seam->classify(at);
      if (!info.ok())
        return Status(ErrorCode::kInvalidArgument,
                      name + ": cannot tell what its memory is: " + info.status().message());
      if (info->kind != PointerKind::kDevice || info->device != b.device)
        return Status(ErrorCode::kInvalidArgument,
                      name + ": byte " + std::to_string(at - b.address) + " is " +
                          std::string(pointer_kind_name(info->kind)) + " memory" +
                          (info->device >= 0 ? " of cuda device " + std::to_string(info->device) : std::string()) +
                          ", not device memory of cuda device " + std::to_string(b.device));
    }
  }
  return Status::Ok();
}

}  // namespace kvferry::device
