#include "device/host_device_copy.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace kvferry::device {
namespace {

Status invalid(const std::string& why) { return Status(ErrorCode::kInvalidArgument, why); }

}  // namespace

std::array<uint8_t, kIpcPayloadBytes> HostIpcSpace::add(const Export& e) {
  std::lock_guard<std::mutex> lock(mu_);
  std::array<uint8_t, kIpcPayloadBytes> p{};
  const uint64_t serial = ++serial_;
  const char tag[] = "kvferry host ipc";
  std::memcpy(p.data(), tag, sizeof(tag) - 1);
  std::memcpy(p.data() + 16, &serial, sizeof(serial));
  exports_[p] = e;
  return p;
}

bool HostIpcSpace::find(const std::array<uint8_t, kIpcPayloadBytes>& payload, Export* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = exports_.find(payload);
  if (it == exports_.end()) return false;
  *out = it->second;
  return true;
}

void HostIpcSpace::remove_allocation(uint64_t base) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(exports_, [base](const auto& kv) { return kv.second.base == base; });
}

HostDeviceCopy::HostDeviceCopy(HostDeviceOptions options, std::shared_ptr<HostIpcSpace> ipc)
    : options_(std::move(options)), ipc_(ipc ? std::move(ipc) : std::make_shared<HostIpcSpace>()) {}

HostDeviceCopy::~HostDeviceCopy() {
  for (const auto& [base, a] : allocs_)
    if (a.kind == PointerKind::kDevice) ipc_->remove_allocation(base);
}

Result<int32_t> HostDeviceCopy::device_count() {
  if (!options_.count_error.ok()) return options_.count_error;
  return options_.devices;
}

const HostDeviceCopy::Alloc* HostDeviceCopy::containing(uint64_t address, uint64_t* base) const {
  auto it = allocs_.upper_bound(address);
  if (it == allocs_.begin()) return nullptr;
  --it;
  if (address - it->first >= it->second.bytes) return nullptr;
  if (base != nullptr) *base = it->first;
  return &it->second;
}

Result<PointerInfo> HostDeviceCopy::classify(uint64_t address) {
  const Alloc* a = containing(address, nullptr);
  if (a == nullptr) return PointerInfo{PointerKind::kPageable, -1};
  return PointerInfo{a->kind, a->kind == PointerKind::kDevice ? a->device : -1};
}

Result<uint64_t> HostDeviceCopy::allocate(PointerKind kind, int32_t device, uint64_t bytes) {
  if (bytes == 0) return invalid("allocation of zero bytes");
  if (bytes > options_.max_alloc_bytes)
    return Status(ErrorCode::kResourceExhausted, "allocation of " + std::to_string(bytes) + " bytes: more than " +
                                                     std::to_string(options_.max_alloc_bytes));
  Alloc a;
  a.bytes = bytes;
  a.kind = kind;
  a.device = device;
  a.memory = std::make_unique<uint8_t[]>(bytes);
  const uint64_t base = reinterpret_cast<uint64_t>(a.memory.get());
  allocs_.emplace(base, std::move(a));
  return base;
}

Result<uint64_t> HostDeviceCopy::alloc_device(int32_t ordinal, uint64_t bytes) {
  if (Status s = check_device(ordinal); !s.ok()) return s;
  return allocate(PointerKind::kDevice, ordinal, bytes);
}

Result<uint64_t> HostDeviceCopy::alloc_pinned(uint64_t bytes) { return allocate(PointerKind::kPinned, -1, bytes); }

Status HostDeviceCopy::release(uint64_t address, PointerKind kind) {
  auto it = allocs_.find(address);
  if (it == allocs_.end() || it->second.kind != kind)
    return invalid("free of " + std::string(pointer_kind_name(kind)) + " memory at " + std::to_string(address) +
                   ": not an allocation of this kind");
  for (uint64_t id : pending_) {
    const Batch& b = batches_.at(id);
    for (const CopyRun& r : b.runs)
      if ((r.src >= address && r.src - address < it->second.bytes) ||
          (r.dst >= address && r.dst - address < it->second.bytes))
        return invalid("free of memory a batch in flight still copies (ticket " + std::to_string(id) + ")");
  }
  if (kind == PointerKind::kDevice) ipc_->remove_allocation(address);
  allocs_.erase(it);
  return Status::Ok();
}

Status HostDeviceCopy::free_device(uint64_t address) { return release(address, PointerKind::kDevice); }
Status HostDeviceCopy::free_pinned(uint64_t address) { return release(address, PointerKind::kPinned); }

// A run that starts in one of this instance's allocations must end in it (CUDA would fault later).
Status HostDeviceCopy::check_extent(const CopyRun& r, size_t i) const {
  for (const auto& [what, start] : {std::pair<const char*, uint64_t>{"source", r.src}, {"destination", r.dst}}) {
    uint64_t base = 0;
    const Alloc* a = containing(start, &base);
    if (a != nullptr && r.bytes > a->bytes - (start - base))
      return invalid("copy batch: run " + std::to_string(i) + ": " + what + " runs past the end of its " +
                     std::string(pointer_kind_name(a->kind)) + " allocation");
  }
  return Status::Ok();
}

Result<CopyTicket> HostDeviceCopy::copy_batch(int32_t ordinal, uint32_t stream, std::span<const CopyRun> runs) {
  if (!enqueue_fault_.ok()) return std::exchange(enqueue_fault_, Status::Ok());
  if (Status s = check_device(ordinal); !s.ok()) return s;
  if (stream >= kMaxStreams)
    return invalid("copy batch: stream " + std::to_string(stream) + " (streams 0.." + std::to_string(kMaxStreams - 1) +
                   ")");
  if (Status s = check_runs(runs); !s.ok()) return s;
  for (size_t i = 0; i < runs.size(); ++i)
    if (Status s = check_extent(runs[i], i); !s.ok()) return s;
  if (batches_.size() >= kMaxTicketsInFlight)
    return Status(ErrorCode::kResourceExhausted,
                  "copy batch: " + std::to_string(kMaxTicketsInFlight) + " tickets not retired");
  const uint64_t id = next_ticket_++;
  Batch& b = batches_[id];
  b.number = ++enqueued_;
  b.device = ordinal;
  b.stream = stream;
  b.runs.assign(runs.begin(), runs.end());
  pending_.push_back(id);
  if (!options_.manual) run_pending();
  return CopyTicket{id};
}

void HostDeviceCopy::execute(Batch& b) {
  size_t limit = b.runs.size();
  auto f = faults_.find(b.number);
  if (f != faults_.end()) limit = std::min(limit, f->second.runs_done);
  for (size_t i = 0; i < limit; ++i)
    std::memcpy(reinterpret_cast<void*>(b.runs[i].dst), reinterpret_cast<const void*>(b.runs[i].src), b.runs[i].bytes);
  if (f != faults_.end()) {
    b.status = Status(ErrorCode::kTransferError, "copy batch " + std::to_string(b.number) + " on cuda device " +
                                                     std::to_string(b.device) + " failed: " + f->second.why);
    faults_.erase(f);
  }
  b.done = true;
}

size_t HostDeviceCopy::run_pending(size_t max_batches) {
  size_t n = 0;
  while (n < max_batches && !pending_.empty()) {
    execute(batches_.at(pending_.front()));
    pending_.pop_front();
    ++n;
  }
  return n;
}

void HostDeviceCopy::fail_batch(uint64_t nth, std::string why, size_t runs_done) {
  faults_[nth] = Fault{std::move(why), runs_done};
}

size_t HostDeviceCopy::in_flight() const { return pending_.size(); }

HostDeviceCopy::Batch* HostDeviceCopy::find(CopyTicket t) {
  auto it = batches_.find(t.id);
  return it == batches_.end() ? nullptr : &it->second;
}

Result<bool> HostDeviceCopy::query(CopyTicket t) {
  const Batch* b = find(t);
  if (b == nullptr) return invalid("unknown copy ticket " + std::to_string(t.id));
  if (!b->done) return false;
  if (!b->status.ok()) return b->status;
  return true;
}

// Runs the batches of t's stream up to t, in order (what waiting on its event lets the device do).
Status HostDeviceCopy::wait(CopyTicket t) {
  Batch* target = find(t);
  if (target == nullptr) return invalid("unknown copy ticket " + std::to_string(t.id));
  for (auto it = pending_.begin(); !target->done && it != pending_.end();) {
    Batch& b = batches_.at(*it);
    if (b.device == target->device && b.stream == target->stream) {
      execute(b);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  return target->status;
}

Status HostDeviceCopy::retire(CopyTicket t) {
  const Batch* b = find(t);
  if (b == nullptr) return invalid("unknown copy ticket " + std::to_string(t.id));
  if (!b->done) return invalid("copy ticket " + std::to_string(t.id) + " is still in flight");
  batches_.erase(t.id);
  return Status::Ok();
}

Result<IpcHandle> HostDeviceCopy::export_ipc(int32_t ordinal, uint64_t address, uint64_t bytes) {
  if (Status s = check_device(ordinal); !s.ok()) return s;
  uint64_t base = 0;
  const Alloc* a = containing(address, &base);
  if (a == nullptr || a->kind != PointerKind::kDevice || a->device != ordinal)
    return invalid("ipc export: " + std::to_string(address) + " is not device memory of cuda device " +
                   std::to_string(ordinal));
  if (bytes == 0 || bytes > kMaxIpcBufferBytes || bytes > a->bytes - (address - base))
    return invalid("ipc export: " + std::to_string(bytes) + " bytes do not fit the allocation");
  IpcHandle h;
  h.device = ordinal;
  h.bytes = bytes;
  h.offset = address - base;
  h.payload = ipc_->add({base, a->bytes, ordinal});
  return h;
}

Result<uint64_t> HostDeviceCopy::open_ipc(int32_t ordinal, const IpcHandle& h, uint64_t expected_bytes) {
  if (Status s = check_ipc_open(ordinal, h, expected_bytes); !s.ok()) return s;
  if (Status s = check_device(ordinal); !s.ok()) return s;
  HostIpcSpace::Export e;
  if (!ipc_->find(h.payload, &e))
    return Status(ErrorCode::kProtocolError, "ipc handle names no exported allocation (forged, or freed)");
  if (e.device != h.device)
    return Status(ErrorCode::kProtocolError, "ipc handle says cuda device " + std::to_string(h.device) +
                                                 ", its allocation is on cuda device " + std::to_string(e.device));
  if (h.offset > e.bytes || h.bytes > e.bytes - h.offset)
    return Status(ErrorCode::kProtocolError, "ipc handle's extent lies outside its allocation");
  const uint64_t address = e.base + h.offset;
  opened_[address] = e.base;
  return address;
}

Status HostDeviceCopy::close_ipc(uint64_t address) {
  if (opened_.erase(address) == 0) return invalid("close_ipc: " + std::to_string(address) + " was not opened");
  return Status::Ok();
}

}  // namespace kvferry::device
