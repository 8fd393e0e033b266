#include "device/device_copy.h"

#include <string>

#include "kvferry/buffers.h"

namespace kvferry::device {

std::string_view pointer_kind_name(PointerKind k) {
  switch (k) {
    case PointerKind::kPageable: return "pageable";
    case PointerKind::kPinned: return "pinned";
    case PointerKind::kDevice: return "device";
    case PointerKind::kManaged: return "managed";
  }
  return "unknown";
}

Status DeviceCopy::check_device(int32_t ordinal) {
  const std::string dev = "cuda device " + std::to_string(ordinal);
  if (ordinal < 0 || ordinal >= kMaxCudaDevices)
    return Status(ErrorCode::kInvalidArgument, dev + ": not a device ordinal");
  auto n = device_count();
  if (!n.ok())
    return Status(ErrorCode::kInvalidArgument, dev + ": no usable CUDA device (" + n.status().message() + ")");
  if (*n == 0) return Status(ErrorCode::kInvalidArgument, dev + ": this machine has no CUDA device");
  if (ordinal >= *n)
    return Status(ErrorCode::kInvalidArgument,
                  dev + ": no such device (this process sees " + std::to_string(*n) + ", ordinals 0.." +
                      std::to_string(*n - 1) + ")");
  return Status::Ok();
}

Status check_runs(std::span<const CopyRun> runs) {
  if (runs.empty()) return Status(ErrorCode::kInvalidArgument, "copy batch: no runs");
  if (runs.size() > kMaxCopyRuns)
    return Status(ErrorCode::kInvalidArgument, "copy batch: " + std::to_string(runs.size()) + " runs, more than " +
                                                   std::to_string(kMaxCopyRuns));
  for (size_t i = 0; i < runs.size(); ++i) {
    const CopyRun& r = runs[i];
    const std::string run = "copy batch: run " + std::to_string(i);
    if (r.src == 0 || r.dst == 0) return Status(ErrorCode::kInvalidArgument, run + ": null address");
    if (r.bytes == 0) return Status(ErrorCode::kInvalidArgument, run + ": zero bytes");
    if (r.src > UINT64_MAX - r.bytes || r.dst > UINT64_MAX - r.bytes)
      return Status(ErrorCode::kInvalidArgument, run + ": address range wraps around");
    if (r.src < r.dst + r.bytes && r.dst < r.src + r.bytes)
      return Status(ErrorCode::kInvalidArgument, run + ": source overlaps destination");
  }
  return Status::Ok();
}

Status check_ipc_open(int32_t ordinal, const IpcHandle& h, uint64_t expected_bytes) {
  if (h.device != ordinal)
    return Status(ErrorCode::kProtocolError, "ipc handle of cuda device " + std::to_string(h.device) +
                                                 ", opened on cuda device " + std::to_string(ordinal));
  if (h.bytes != expected_bytes)
    return Status(ErrorCode::kProtocolError, "ipc handle of " + std::to_string(h.bytes) + " bytes, agreed " +
                                                 std::to_string(expected_bytes));
  return Status::Ok();
}

}  // namespace kvferry::device
