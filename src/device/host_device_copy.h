// The host implementation of the device-copy seam (device/device_copy.h): "device" memory is host
// memory this instance allocated and tags with a simulated device ordinal, copies are memcpy, and
// completion is tracked exactly as the CUDA side tracks it (tickets per batch, per-stream order).
// It lets the copy pipeline, staging, IPC handle exchange and completion logic run on CPU, and
// it is deterministic: no threads, no clocks. Test knobs:
//   - manual mode: batches stay in flight until run_pending() or wait() runs them (a slow device);
//   - fail_batch: the nth batch enqueued fails on the "device" after copying some of its runs;
//   - fail_next_enqueue: the next copy_batch is refused before anything is enqueued;
//   - devices = 0, or count_error: a machine without a GPU, or without a driver.
// It is stricter than CUDA where CUDA would fault asynchronously: a run that starts in one of its
// device allocations and runs past its end is refused at enqueue.
//
// IPC: instances that share one HostIpcSpace play processes on one host. export_ipc registers the
// allocation under a payload no one can guess from the handle's other fields; open_ipc refuses a
// payload the space does not hold (forged, or its allocation freed), and a handle whose device or
// extent does not match the allocation it names.
//
// Thread contract: an instance is used by one thread at a time; a HostIpcSpace is synchronized.
#pragma once
#include <cstdint>
#include <array>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/device_copy.h"

namespace kvferry::device {

struct HostDeviceOptions {
  int32_t devices = 1;       // simulated devices (0: a machine without a GPU)
  Status count_error;        // non-ok: device_count() fails with it (a machine without a driver)
  bool manual = false;       // batches wait for run_pending()/wait() instead of running at enqueue
  uint64_t max_alloc_bytes = uint64_t{1} << 32;  // larger allocations are kResourceExhausted
};

class HostIpcSpace {
 public:
  struct Export {
    uint64_t base = 0;   // the allocation's start
    uint64_t bytes = 0;  // the allocation's size
    int32_t device = 0;
  };
  std::array<uint8_t, kIpcPayloadBytes> add(const Export& e);
  bool find(const std::array<uint8_t, kIpcPayloadBytes>& payload, Export* out) const;
  void remove_allocation(uint64_t base);

 private:
  mutable std::mutex mu_;
  uint64_t serial_ = 0;
  std::map<std::array<uint8_t, kIpcPayloadBytes>, Export> exports_;
};

class HostDeviceCopy final : public DeviceCopy {
 public:
  explicit HostDeviceCopy(HostDeviceOptions options = {}, std::shared_ptr<HostIpcSpace> ipc = nullptr);
  ~HostDeviceCopy() override;

  std::string_view name() const override { return "host"; }
  Result<int32_t> device_count() override;
  Result<PointerInfo> classify(uint64_t address) override;
  Result<uint64_t> alloc_device(int32_t ordinal, uint64_t bytes) override;
  Status free_device(uint64_t address) override;
  Result<uint64_t> alloc_pinned(uint64_t bytes) override;
  Status free_pinned(uint64_t address) override;
  Result<CopyTicket> copy_batch(int32_t ordinal, uint32_t stream, std::span<const CopyRun> runs) override;
  Result<bool> query(CopyTicket t) override;
  Status wait(CopyTicket t) override;
  Status retire(CopyTicket t) override;
  Result<IpcHandle> export_ipc(int32_t ordinal, uint64_t address, uint64_t bytes) override;
  Result<uint64_t> open_ipc(int32_t ordinal, const IpcHandle& h, uint64_t expected_bytes) override;
  Status close_ipc(uint64_t address) override;

  // Runs up to `max_batches` in-flight batches in the order they were enqueued; returns how many.
  size_t run_pending(size_t max_batches = SIZE_MAX);
  // The nth batch enqueued (1-based, counted from this instance's creation) fails when it runs,
  // with kTransferError carrying `why`, after copying its first `runs_done` runs.
  void fail_batch(uint64_t nth, std::string why, size_t runs_done = 0);
  // The next copy_batch returns `s` (non-ok) and enqueues nothing.
  void fail_next_enqueue(Status s) { enqueue_fault_ = std::move(s); }
  uint64_t batches_enqueued() const { return enqueued_; }
  size_t in_flight() const;
  size_t open_ipc_count() const { return opened_.size(); }

 private:
  struct Alloc {
    uint64_t bytes = 0;
    PointerKind kind = PointerKind::kDevice;
    int32_t device = -1;
    std::unique_ptr<uint8_t[]> memory;
  };
  struct Batch {
    uint64_t number = 0;  // 1-based enqueue count
    int32_t device = 0;
    uint32_t stream = 0;
    std::vector<CopyRun> runs;
    bool done = false;
    Status status;
  };
  struct Fault {
    std::string why;
    size_t runs_done = 0;
  };

  const Alloc* containing(uint64_t address, uint64_t* base) const;
  Status check_extent(const CopyRun& r, size_t i) const;
  Result<uint64_t> allocate(PointerKind kind, int32_t device, uint64_t bytes);
  Status release(uint64_t address, PointerKind kind);
  void execute(Batch& b);
  Batch* find(CopyTicket t);

  HostDeviceOptions options_;
  std::shared_ptr<HostIpcSpace> ipc_;
  std::map<uint64_t, Alloc> allocs_;        // by base address
  std::map<uint64_t, Batch> batches_;       // by ticket id, not yet retired
  std::deque<uint64_t> pending_;            // ticket ids in flight, in enqueue order
  std::map<uint64_t, Fault> faults_;        // by batch number
  std::map<uint64_t, uint64_t> opened_;     // open_ipc address -> the exporter's allocation base
  Status enqueue_fault_;
  uint64_t next_ticket_ = 1;
  uint64_t enqueued_ = 0;
};

}  // namespace kvferry::device
