// The CUDA side of the device seam in a kvferry built without CUDA (KVFERRY_CUDA=OFF): a refusal.
#include "device/device_copy.h"

namespace kvferry::device {

bool built_with_cuda() { return false; }

Result<std::unique_ptr<DeviceCopy>> open_cuda_device_copy() {
  return Status(ErrorCode::kInvalidArgument,
                "cuda device memory: this kvferry was built without CUDA (KVFERRY_CUDA=OFF; docs/gpu.md)");
}

}  // namespace kvferry::device
