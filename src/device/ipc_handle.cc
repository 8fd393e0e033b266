#include "device/ipc_handle.h"

#include <algorithm>
#include <cstring>

#include "kvferry/buffers.h"

namespace kvferry::device {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'I', 'H'};

template <typename T>
void put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
}

template <typename T>
T get(std::string_view in, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
  return static_cast<T>(v);
}

Status bad(const std::string& why) { return Status(ErrorCode::kProtocolError, "ipc handle: " + why); }

}  // namespace

std::string encode_ipc_handle(const IpcHandle& h) {
  std::string out(kMagic, sizeof(kMagic));
  put<uint16_t>(out, kIpcHandleVersion);
  put<uint8_t>(out, static_cast<uint8_t>(h.kind));
  put<uint8_t>(out, 0);
  put<uint32_t>(out, static_cast<uint32_t>(h.device));
  put<uint32_t>(out, 0);
  put<uint64_t>(out, h.bytes);
  put<uint64_t>(out, h.offset);
  out.append(reinterpret_cast<const char*>(h.payload.data()), h.payload.size());
  return out;
}

Result<IpcHandle> parse_ipc_handle(std::string_view in) {
  if (in.size() != kIpcHandleBytes)
    return bad(std::to_string(in.size()) + " bytes, a handle has " + std::to_string(kIpcHandleBytes));
  if (std::memcmp(in.data(), kMagic, sizeof(kMagic)) != 0) return bad("bad magic");
  const auto version = get<uint16_t>(in, 4);
  if (version != kIpcHandleVersion) return bad("version " + std::to_string(version) + " (this rank speaks 1)");
  const auto kind = get<uint8_t>(in, 6);
  if (kind != static_cast<uint8_t>(IpcHandleKind::kLegacy)) return bad("unknown kind " + std::to_string(kind));
  if (get<uint8_t>(in, 7) != 0 || get<uint32_t>(in, 12) != 0) return bad("reserved bytes not zero");
  IpcHandle h;
  h.kind = IpcHandleKind::kLegacy;
  h.device = static_cast<int32_t>(get<uint32_t>(in, 8));
  if (h.device < 0 || h.device >= kMaxCudaDevices)
    return bad("device " + std::to_string(h.device) + " outside [0, " + std::to_string(kMaxCudaDevices) + ")");
  h.bytes = get<uint64_t>(in, 16);
  h.offset = get<uint64_t>(in, 24);
  if (h.bytes == 0) return bad("zero bytes");
  if (h.bytes > kMaxIpcBufferBytes)
    return bad(std::to_string(h.bytes) + " bytes, more than " + std::to_string(kMaxIpcBufferBytes));
  if (h.offset > kMaxIpcBufferBytes - h.bytes) return bad("offset " + std::to_string(h.offset) + " + bytes too large");
  std::memcpy(h.payload.data(), in.data() + 32, kIpcPayloadBytes);
  if (std::all_of(h.payload.begin(), h.payload.end(), [](uint8_t b) { return b == 0; }))
    return bad("all-zero payload");
  return h;
}

}  // namespace kvferry::device
