// Registration's check of device buffers (docs/gpu.md, "Memory kinds"): what check_buffers
// (kvferry/buffers.h) cannot know without asking the runtime. For every kCuda buffer, in order:
// a device seam exists (built with CUDA, the runtime finds a device), its ordinal names a device
// this process has, and both its first and last byte are device memory of that device. Host
// buffers are not looked at, so a rank may mix host and device buffers.
//
// Errors: kInvalidArgument, the message naming the buffer (kind and index among its kind, as
// check_buffers does) and its device.
// Thread contract: called by the thread that registers the buffers.
#pragma once
#include <vector>

#include "device/device_copy.h"
#include "kvferry/buffers.h"

namespace kvferry::device {

// `seam`: the device seam to ask; null: the process's CUDA seam (open_cuda_device_copy(), whose
// refusal is the answer when there is none). Ok at once when no buffer is kCuda.
Status check_device_buffers(const std::vector<BufferDesc>& buffers, DeviceCopy* seam);

}  // namespace kvferry::device
