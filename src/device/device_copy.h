// The device-copy seam (docs/gpu.md): everything kvferry asks of a GPU runtime, behind one small
// interface, so that the copy pipeline, staging, IPC handle exchange and completion logic are
// written once and tested on CPU against the host implementation (device/host_device_copy.h),
// while the CUDA implementation (device/cuda_device_copy.h: the CUDA runtime API) is the other
// side of the seam.
//
// Model (CUDA's): devices by ordinal; device memory and pinned host memory allocated per device /
// per process; copies enqueued in batches of scattered runs on one of kMaxStreams streams of a
// device, in stream order (a batch completes after every batch enqueued before it on the same
// stream); each batch gets a ticket (an event recorded after it) that is queried, waited for and
// retired; IPC handles (device/ipc_handle.h) export device memory to another process on the host.
//
// Errors: kInvalidArgument for a caller's mistake or a refusal of the environment (no usable
// device, an ordinal the machine lacks: the message names the device); kProtocolError for a
// peer's handle that does not fit what this rank agreed; kTransferError for copies that failed
// on the device; kResourceExhausted when an allocation or the ticket bound is exhausted.
//
// Thread contract: an instance is used by one thread at a time (its owner); nothing it returns
// is shared with another thread by the seam itself.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "device/ipc_handle.h"
#include "kvferry/error.h"

namespace kvferry::device {

// One piece of a scattered copy: [src, src + bytes) to [dst, dst + bytes). Addresses are this
// process's (host virtual addresses or device pointers: CUDA's unified addressing).
struct CopyRun {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
};

constexpr size_t kMaxCopyRuns = size_t{1} << 20;  // runs in one batch
constexpr uint32_t kMaxStreams = 8;               // streams per device
constexpr size_t kMaxTicketsInFlight = 4096;      // tickets not yet retired, per instance

// A batch's completion: an event recorded after its copies. 0 is no ticket.
struct CopyTicket {
  uint64_t id = 0;
  friend bool operator==(const CopyTicket&, const CopyTicket&) = default;
};

// What an address is, as the runtime sees it (cudaPointerGetAttributes' types).
enum class PointerKind : uint8_t {
  kPageable = 0,  // host memory the runtime does not know
  kPinned = 1,    // page-locked host memory (cudaMallocHost / cudaHostRegister)
  kDevice = 2,    // device memory of `device`
  kManaged = 3,   // unified (managed) memory
};
std::string_view pointer_kind_name(PointerKind k);  // "pageable", "pinned", "device", "managed"

struct PointerInfo {
  PointerKind kind = PointerKind::kPageable;
  int32_t device = -1;  // kDevice / kManaged: the device ordinal; otherwise -1
};

class DeviceCopy {
 public:
  virtual ~DeviceCopy() = default;
  DeviceCopy() = default;
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

  virtual std::string_view name() const = 0;  // "host", "cuda"

  // Devices this process can use; an error when the runtime cannot be used at all (no driver ...).
  virtual Result<int32_t> device_count() = 0;
  // Ok when `ordinal` names a usable device; kInvalidArgument naming the device otherwise (no
  // usable device, the runtime's error, an ordinal the machine lacks).
  Status check_device(int32_t ordinal);

  virtual Result<PointerInfo> classify(uint64_t address) = 0;

  virtual Result<uint64_t> alloc_device(int32_t ordinal, uint64_t bytes) = 0;
  virtual Status free_device(uint64_t address) = 0;
  virtual Result<uint64_t> alloc_pinned(uint64_t bytes) = 0;
  virtual Status free_pinned(uint64_t address) = 0;

  // Enqueues `runs` (checked by check_runs first) on stream `stream` (< kMaxStreams) of device
  // `ordinal`, then an event; returns its ticket. Nothing is enqueued when it returns an error.
  virtual Result<CopyTicket> copy_batch(int32_t ordinal, uint32_t stream, std::span<const CopyRun> runs) = 0;
  // true: the batch (and every batch before it on its stream) is complete; false: still in flight;
  // an error: its copies failed (kTransferError; nothing of it is in flight any more) or the
  // ticket is unknown (kInvalidArgument). Asking again gives the same answer until retire.
  virtual Result<bool> query(CopyTicket t) = 0;
  // Blocks until the batch is complete; its status as query's.
  virtual Status wait(CopyTicket t) = 0;
  // Forgets a ticket. kInvalidArgument for an unknown ticket or one still in flight (a batch is
  // never forgotten while its copies may still write).
  virtual Status retire(CopyTicket t) = 0;

  // The handle of device memory [address, address + bytes) of `ordinal`, for another process.
  virtual Result<IpcHandle> export_ipc(int32_t ordinal, uint64_t address, uint64_t bytes) = 0;
  // Maps a peer's handle (parsed by parse_ipc_handle) on device `ordinal`; returns the address of
  // the exported buffer's start in this process. Refused before the runtime sees the payload:
  // a handle of another device than `ordinal`, or of other than `expected_bytes` (what this rank
  // agreed with the peer: kProtocolError).
  virtual Result<uint64_t> open_ipc(int32_t ordinal, const IpcHandle& h, uint64_t expected_bytes) = 0;
  virtual Status close_ipc(uint64_t address) = 0;
};

// The checks of a batch every implementation makes before enqueuing anything (kInvalidArgument
// naming the run): 1..kMaxCopyRuns runs, none null or empty, none wrapping around, no run whose
// source overlaps its own destination.
Status check_runs(std::span<const CopyRun> runs);
// The checks of open_ipc before the runtime sees the payload.
Status check_ipc_open(int32_t ordinal, const IpcHandle& h, uint64_t expected_bytes);

// The process's CUDA seam: the CUDA implementation when kvferry was built with CUDA and the
// runtime finds a device; otherwise kInvalidArgument saying which (built without CUDA
// (KVFERRY_CUDA=OFF); no usable CUDA device, with the runtime's error). Never aborts.
Result<std::unique_ptr<DeviceCopy>> open_cuda_device_copy();
// Whether this kvferry was built with CUDA (KVFERRY_CUDA).
bool built_with_cuda();

}  // namespace kvferry::device
