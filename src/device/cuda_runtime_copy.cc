// The CUDA implementation of the device-copy seam (device/device_copy.h), on the CUDA runtime API
// (linked statically: CUDA::cudart_static). Built only with KVFERRY_CUDA (src/CMakeLists.txt; the
// build without it has device/cuda_absent.cc instead); reached through open_cuda_device_copy(),
// which refuses, never aborts, when the runtime finds no usable device.
//
//   copies      cudaMemcpyBatchAsync of a batch's runs on one of kMaxStreams non-blocking streams
//               per device (created on first use); where the batch call is not supported, one
//               cudaMemcpyAsync (cudaMemcpyDefault) per run
//   completion  a cudaEvent (timing disabled) recorded after each batch; query = cudaEventQuery,
//               wait = cudaEventSynchronize; retire destroys the event once it completed
//   classify    cudaPointerGetAttributes
//   memory      cudaMalloc / cudaFree, cudaMallocHost / cudaFreeHost
//   IPC         legacy handles: cudaIpcGetMemHandle, with the allocation's start and size from the
//               driver's cuMemGetAddressRange (through cudaGetDriverEntryPointByVersion);
//               cudaIpcOpenMemHandle (cudaIpcMemLazyEnablePeerAccess) / cudaIpcCloseMemHandle
//
// UNVERIFIED: this file has never run on a GPU (docs/gpu.md). Only its refusal on a machine
// without a GPU or driver is tested (cuda_device_copy_test.cc).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "device/device_copy.h"
#include "kvferry/buffers.h"

namespace kvferry::device {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcPayloadBytes, "a legacy IPC handle is 64 bytes");

std::string cuda_error(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

// CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr dptr), CUdeviceptr
// being a 64-bit integer: the driver's answer to "which allocation holds this pointer".
using GetAddressRange = int (*)(unsigned long long*, size_t*, unsigned long long);

class CudaDeviceCopy final : public DeviceCopy {
 public:
  explicit CudaDeviceCopy(int32_t count) : count_(count) {}

  ~CudaDeviceCopy() override {
    // Copies still in flight are waited out before anything they touch can be released.
    for (auto& [id, t] : tickets_) {
      cudaEventSynchronize(t.event);
      cudaEventDestroy(t.event);
    }
    for (auto& [address, base] : opened_) cudaIpcCloseMemHandle(reinterpret_cast<void*>(base));
    for (auto& [device, streams] : streams_)
      for (cudaStream_t s : streams)
        if (s != nullptr) cudaStreamDestroy(s);
  }

  std::string_view name() const override { return "cuda"; }
  Result<int32_t> device_count() override { return count_; }

  Result<PointerInfo> classify(uint64_t address) override {
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, reinterpret_cast<const void*>(address));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status(ErrorCode::kInvalidArgument, cuda_error("cudaPointerGetAttributes", e));
    }
    switch (a.type) {
      case cudaMemoryTypeHost: return PointerInfo{PointerKind::kPinned, -1};
      case cudaMemoryTypeDevice: return PointerInfo{PointerKind::kDevice, a.device};
      case cudaMemoryTypeManaged: return PointerInfo{PointerKind::kManaged, a.device};
      default: return PointerInfo{PointerKind::kPageable, -1};
    }
  }

  Result<uint64_t> alloc_device(int32_t ordinal, uint64_t bytes) override {
    if (Status s = use(ordinal); !s.ok()) return s;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) return Status(ErrorCode::kResourceExhausted, cuda_error("cudaMalloc", e));
    return reinterpret_cast<uint64_t>(p);
  }

  Status free_device(uint64_t address) override {
    const cudaError_t e = cudaFree(reinterpret_cast<void*>(address));
    return e == cudaSuccess ? Status::Ok() : Status(ErrorCode::kInvalidArgument, cuda_error("cudaFree", e));
  }

  Result<uint64_t> alloc_pinned(uint64_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess) return Status(ErrorCode::kResourceExhausted, cuda_error("cudaMallocHost", e));
    return reinterpret_cast<uint64_t>(p);
  }

  Status free_pinned(uint64_t address) override {
    const cudaError_t e = cudaFreeHost(reinterpret_cast<void*>(address));
    return e == cudaSuccess ? Status::Ok() : Status(ErrorCode::kInvalidArgument, cuda_error("cudaFreeHost", e));
  }

  Result<CopyTicket> copy_batch(int32_t ordinal, uint32_t stream, std::span<const CopyRun> runs) override {
    if (Status s = use(ordinal); !s.ok()) return s;
    if (stream >= kMaxStreams)
      return Status(ErrorCode::kInvalidArgument, "copy batch: stream " + std::to_string(stream));
    if (Status s = check_runs(runs); !s.ok()) return s;
    if (tickets_.size() >= kMaxTicketsInFlight)
      return Status(ErrorCode::kResourceExhausted, "copy batch: too many tickets not retired");
    auto st = stream_of(ordinal, stream);
    if (!st.ok()) return st.status();
    const Status enqueued = enqueue(*st, runs);
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, *st);
    if (!enqueued.ok() || e != cudaSuccess) {
      // Part of the batch may be enqueued: wait it out so nothing writes after the refusal.
      cudaStreamSynchronize(*st);
      if (ev != nullptr) cudaEventDestroy(ev);
      return enqueued.ok() ? Status(ErrorCode::kTransferError, cuda_error("cudaEventRecord", e)) : enqueued;
    }
    const uint64_t id = next_ticket_++;
    tickets_[id] = Ticket{ev, Status::Ok(), false};
    return CopyTicket{id};
  }

  Result<bool> query(CopyTicket t) override {
    auto it = tickets_.find(t.id);
    if (it == tickets_.end()) return Status(ErrorCode::kInvalidArgument, "unknown copy ticket " + std::to_string(t.id));
    Ticket& k = it->second;
    if (!k.done) {
      const cudaError_t e = cudaEventQuery(k.event);
      if (e == cudaErrorNotReady) return false;
      k.done = true;
      if (e != cudaSuccess) k.status = Status(ErrorCode::kTransferError, cuda_error("cudaEventQuery", e));
    }
    if (!k.status.ok()) return k.status;
    return true;
  }

  Status wait(CopyTicket t) override {
    auto it = tickets_.find(t.id);
    if (it == tickets_.end()) return Status(ErrorCode::kInvalidArgument, "unknown copy ticket " + std::to_string(t.id));
    Ticket& k = it->second;
    if (!k.done) {
      const cudaError_t e = cudaEventSynchronize(k.event);
      k.done = true;
      if (e != cudaSuccess) k.status = Status(ErrorCode::kTransferError, cuda_error("cudaEventSynchronize", e));
    }
    return k.status;
  }

  Status retire(CopyTicket t) override {
    auto q = query(t);
    if (q.ok() && !*q)
      return Status(ErrorCode::kInvalidArgument, "copy ticket " + std::to_string(t.id) + " is still in flight");
    auto it = tickets_.find(t.id);
    if (it == tickets_.end()) return Status(ErrorCode::kInvalidArgument, "unknown copy ticket " + std::to_string(t.id));
    cudaEventDestroy(it->second.event);
    tickets_.erase(it);
    return Status::Ok();
  }

  Result<IpcHandle> export_ipc(int32_t ordinal, uint64_t address, uint64_t bytes) override {
    if (Status s = use(ordinal); !s.ok()) return s;
    auto info = classify(address);
    if (!info.ok()) return info.status();
    if (info->kind != PointerKind::kDevice || info->device != ordinal)
      return Status(ErrorCode::kInvalidArgument,
                    "ipc export: not device memory of cuda device " + std::to_string(ordinal));
    auto range = allocation_of(address);
    if (!range.ok()) return range.status();
    const auto [base, size] = *range;
    if (bytes == 0 || bytes > kMaxIpcBufferBytes || bytes > size - (address - base))
      return Status(ErrorCode::kInvalidArgument,
                    "ipc export: " + std::to_string(bytes) + " bytes do not fit the allocation");
    cudaIpcMemHandle_t raw{};
    const cudaError_t e = cudaIpcGetMemHandle(&raw, reinterpret_cast<void*>(base));
    if (e != cudaSuccess) return Status(ErrorCode::kInvalidArgument, cuda_error("cudaIpcGetMemHandle", e));
    IpcHandle h;
    h.device = ordinal;
    h.bytes = bytes;
    h.offset = address - base;
    std::memcpy(h.payload.data(), &raw, sizeof(raw));
    return h;
  }

  Result<uint64_t> open_ipc(int32_t ordinal, const IpcHandle& h, uint64_t expected_bytes) override {
    if (Status s = check_ipc_open(ordinal, h, expected_bytes); !s.ok()) return s;
    if (Status s = use(ordinal); !s.ok()) return s;
    cudaIpcMemHandle_t raw{};
    std::memcpy(&raw, h.payload.data(), sizeof(raw));
    void* p = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&p, raw, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status(ErrorCode::kProtocolError, cuda_error("cudaIpcOpenMemHandle", e));
    }
    const uint64_t base = reinterpret_cast<uint64_t>(p);
    // The handle's claims against what the driver mapped: its device and its extent.
    auto info = classify(base);
    auto range = allocation_of(base);
    Status bad;
    if (!info.ok() || !range.ok()) {
      bad = !info.ok() ? info.status() : range.status();
    } else if (info->device != h.device) {
      bad = Status(ErrorCode::kProtocolError, "ipc handle says cuda device " + std::to_string(h.device) +
                                                  ", its allocation is on cuda device " + std::to_string(info->device));
    } else if (h.offset > range->second || h.bytes > range->second - h.offset) {
      bad = Status(ErrorCode::kProtocolError, "ipc handle's extent lies outside its allocation");
    }
    if (!bad.ok()) {
      cudaIpcCloseMemHandle(p);
      return bad;
    }
    opened_[base + h.offset] = base;
    return base + h.offset;
  }

  Status close_ipc(uint64_t address) override {
    auto it = opened_.find(address);
    if (it == opened_.end()) return Status(ErrorCode::kInvalidArgument, "close_ipc: not opened");
    const cudaError_t e = cudaIpcCloseMemHandle(reinterpret_cast<void*>(it->second));
    opened_.erase(it);
    return e == cudaSuccess ? Status::Ok() : Status(ErrorCode::kInternal, cuda_error("cudaIpcCloseMemHandle", e));
  }

 private:
  struct Ticket {
    cudaEvent_t event = nullptr;
    Status status;
    bool done = false;
  };

  Status use(int32_t ordinal) {
    if (Status s = check_device(ordinal); !s.ok()) return s;
    const cudaError_t e = cudaSetDevice(ordinal);
    return e == cudaSuccess ? Status::Ok() : Status(ErrorCode::kInvalidArgument, cuda_error("cudaSetDevice", e));
  }

  Result<cudaStream_t> stream_of(int32_t ordinal, uint32_t index) {
    cudaStream_t& s = streams_[ordinal][index];
    if (s == nullptr) {
      const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (e != cudaSuccess) {
        s = nullptr;
        return Status(ErrorCode::kResourceExhausted, cuda_error("cudaStreamCreateWithFlags", e));
      }
    }
    return s;
  }

  Status enqueue(cudaStream_t st, std::span<const CopyRun> runs) {
    if (batch_supported_) {
      std::vector<void*> dsts;
      std::vector<const void*> srcs;
      std::vector<size_t> sizes;
      dsts.reserve(runs.size());
      srcs.reserve(runs.size());
      sizes.reserve(runs.size());
      for (const CopyRun& r : runs) {
        dsts.push_back(reinterpret_cast<void*>(r.dst));
        srcs.push_back(reinterpret_cast<const void*>(r.src));
        sizes.push_back(r.bytes);
      }
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      size_t attr_index = 0;
      const cudaError_t e =
          cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), runs.size(), &attr, &attr_index, 1, st);
      if (e == cudaSuccess) return Status::Ok();
      cudaGetLastError();
      if (e != cudaErrorNotSupported) return Status(ErrorCode::kTransferError, cuda_error("cudaMemcpyBatchAsync", e));
      batch_supported_ = false;
    }
    for (const CopyRun& r : runs) {
      const cudaError_t e = cudaMemcpyAsync(reinterpret_cast<void*>(r.dst), reinterpret_cast<const void*>(r.src),
                                            r.bytes, cudaMemcpyDefault, st);
      if (e != cudaSuccess) return Status(ErrorCode::kTransferError, cuda_error("cudaMemcpyAsync", e));
    }
    return Status::Ok();
  }

  // The allocation holding `address`: its start and size (cuMemGetAddressRange).
  Result<std::pair<uint64_t, uint64_t>> allocation_of(uint64_t address) {
    if (get_range_ == nullptr) {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult q{};
      const cudaError_t e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q);
      if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == nullptr)
        return Status(ErrorCode::kInternal, "the driver has no cuMemGetAddressRange");
      get_range_ = reinterpret_cast<GetAddressRange>(fn);
    }
    unsigned long long base = 0;
    size_t size = 0;
    const int r = get_range_(&base, &size, address);
    if (r != 0)
      return Status(ErrorCode::kInvalidArgument, "cuMemGetAddressRange: CUresult " + std::to_string(r));
    return std::pair<uint64_t, uint64_t>{base, size};
  }

  const int32_t count_;
  std::map<int32_t, std::array<cudaStream_t, kMaxStreams>> streams_;
  std::map<uint64_t, Ticket> tickets_;
  std::map<uint64_t, uint64_t> opened_;  // open_ipc's address -> the mapped allocation's start
  uint64_t next_ticket_ = 1;
  bool batch_supported_ = true;
  GetAddressRange get_range_ = nullptr;
};

}  // namespace

bool built_with_cuda() { return true; }

Result<std::unique_ptr<DeviceCopy>> open_cuda_device_copy() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kInvalidArgument, "cuda device memory: no usable CUDA device (" +
                                                   cuda_error("cudaGetDeviceCount", e) + ")");
  }
  if (n <= 0) return Status(ErrorCode::kInvalidArgument, "cuda device memory: this machine has no CUDA device");
  std::unique_ptr<DeviceCopy> d = std::make_unique<CudaDeviceCopy>(std::min(n, int{kMaxCudaDevices}));
  return d;
}

}  // namespace kvferry::device
