// The wire form of a CUDA IPC handle (docs/gpu.md, "IPC handles"): what a decode rank exports for
// each of its device buffers and a prefill rank on the same host opens. A peer's handle is
// untrusted: parse_ipc_handle checks every byte before anything (the device seam, CUDA) sees it,
// and the opener checks it against what this rank agreed (device, bytes) before opening it.
//
// Layout (little-endian, kIpcHandleBytes in all):
//   0  magic "KVIH"      4  version u16 (1)    6  kind u8    7  reserved u8 (0)
//   8  device i32        12 reserved u32 (0)   16 bytes u64  24 offset u64
//   32 payload: kIpcPayloadBytes (kLegacy: cudaIpcMemHandle_t's bytes; never all zero)
// `offset`: where the exported buffer starts inside the allocation the payload names (a legacy
// handle names a whole cudaMalloc allocation; opening it maps the allocation's start).
//
// Thread contract: value types and pure functions.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvferry/error.h"

namespace kvferry::device {

enum class IpcHandleKind : uint8_t {
  kLegacy = 1,  // cudaIpcGetMemHandle of cudaMalloc memory
  // 2 is kept for a POSIX file descriptor handle of the CUDA virtual memory API (passed over a
  // Unix socket, never in these bytes): not built yet, refused by the parser.
};

constexpr size_t kIpcPayloadBytes = 64;  // CUDA_IPC_HANDLE_SIZE
constexpr size_t kIpcHandleBytes = 32 + kIpcPayloadBytes;
constexpr uint16_t kIpcHandleVersion = 1;
// No exported buffer is larger (a bound on what a peer can make this rank map).
constexpr uint64_t kMaxIpcBufferBytes = uint64_t{1} << 44;  // 16 TiB

struct IpcHandle {
  IpcHandleKind kind = IpcHandleKind::kLegacy;
  int32_t device = 0;   // the exporter's device ordinal
  uint64_t bytes = 0;   // bytes of the exported buffer
  uint64_t offset = 0;  // the buffer's start inside the allocation the payload names
  std::array<uint8_t, kIpcPayloadBytes> payload{};

  friend bool operator==(const IpcHandle&, const IpcHandle&) = default;
};

std::string encode_ipc_handle(const IpcHandle& h);
// kProtocolError naming what is wrong: a size other than kIpcHandleBytes, bad magic or version,
// an unknown kind, non-zero reserved bytes, a device outside [0, kMaxCudaDevices), zero bytes or
// more than kMaxIpcBufferBytes, offset + bytes overflowing, an all-zero payload.
Result<IpcHandle> parse_ipc_handle(std::string_view bytes);

}  // namespace kvferry::device
