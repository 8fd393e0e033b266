#include "device/staging_ring.h"

#include <string>

namespace kvferry::device {

Result<std::unique_ptr<StagingRing>> StagingRing::create(DeviceCopy& seam, int32_t device, uint32_t stream,
                                                         uint64_t slot_bytes, uint32_t slots) {
  if (slots == 0 || slots > kMaxStagingSlots)
    return Status(ErrorCode::kInvalidArgument, "staging: " + std::to_string(slots) + " slots (1.." +
                                                   std::to_string(kMaxStagingSlots) + ")");
  if (slot_bytes == 0) return Status(ErrorCode::kInvalidArgument, "staging: zero slot bytes");
  if (Status s = seam.check_device(device); !s.ok()) return s;
  std::unique_ptr<StagingRing> ring(new StagingRing(seam, device, stream, slot_bytes));
  for (uint32_t i = 0; i < slots; ++i) {
    auto m = seam.alloc_pinned(slot_bytes);
    if (!m.ok()) return m.status();  // the destructor frees the slots allocated so far
    ring->memory_.push_back(*m);
    ring->state_.push_back(SlotState::kFree);
  }
  return ring;
}

StagingRing::StagingRing(DeviceCopy& seam, int32_t device, uint32_t stream, uint64_t slot_bytes)
    : seam_(seam), device_(device), stream_(stream), slot_bytes_(slot_bytes) {}

StagingRing::~StagingRing() {
  for (const Queued& q : queued_) {
    (void)seam_.wait(q.ticket);  // a slot is never freed while a copy may still touch it
    (void)seam_.retire(q.ticket);
  }
  for (uint64_t m : memory_) (void)seam_.free_pinned(m);
}

uint32_t StagingRing::free_slots() const {
  uint32_t n = 0;
  for (SlotState s : state_) n += s == SlotState::kFree ? 1 : 0;
  return n;
}

uint8_t* StagingRing::slot_memory(uint32_t slot) const {
  return slot < memory_.size() ? reinterpret_cast<uint8_t*>(memory_[slot]) : nullptr;
}

Result<uint64_t> StagingRing::packed_bytes(std::span<const DevicePiece> pieces) const {
  if (pieces.empty()) return Status(ErrorCode::kInvalidArgument, "staging: a chunk of no pieces");
  uint64_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].bytes > slot_bytes_ - total)
      return Status(ErrorCode::kInvalidArgument, "staging: piece " + std::to_string(i) +
                                                     " overflows the slot of " + std::to_string(slot_bytes_) +
                                                     " bytes");
    total += pieces[i].bytes;
  }
  return total;
}

Status StagingRing::queue(uint32_t slot, uint64_t room, uint64_t bytes, const std::vector<CopyRun>& runs) {
  auto t = seam_.copy_batch(device_, stream_, runs);
  if (!t.ok()) return t.status();
  state_[slot] = SlotState::kQueued;
  queued_.push_back({StagedChunk{room, slot, bytes, Status::Ok()}, *t});
  return Status::Ok();
}

Result<std::optional<uint32_t>> StagingRing::gather(uint64_t room, std::span<const DevicePiece> pieces) {
  auto total = packed_bytes(pieces);
  if (!total.ok()) return total.status();
  std::optional<uint32_t> slot = acquire();
  if (!slot) return std::optional<uint32_t>();
  std::vector<CopyRun> runs;
  runs.reserve(pieces.size());
  uint64_t at = memory_[*slot];
  for (const DevicePiece& p : pieces) {
    runs.push_back({p.address, at, p.bytes});
    at += p.bytes;
  }
  if (Status s = queue(*slot, room, *total, runs); !s.ok()) {
    state_[*slot] = SlotState::kFree;
    return s;
  }
  return slot;
}

std::optional<uint32_t> StagingRing::acquire() {
  for (uint32_t i = 0; i < state_.size(); ++i) {
    if (state_[i] == SlotState::kFree) {
      state_[i] = SlotState::kAcquired;
      return i;
    }
  }
  return std::nullopt;
}

Status StagingRing::scatter(uint32_t slot, uint64_t room, std::span<const DevicePiece> pieces) {
  if (slot >= state_.size() || state_[slot] != SlotState::kAcquired)
    return Status(ErrorCode::kInvalidArgument,
                  "staging: scatter from slot " + std::to_string(slot) + ", not acquired");
  auto total = packed_bytes(pieces);
  if (!total.ok()) return total.status();
  std::vector<CopyRun> runs;
  runs.reserve(pieces.size());
  uint64_t at = memory_[slot];
  for (const DevicePiece& p : pieces) {
    runs.push_back({at, p.address, p.bytes});
    at += p.bytes;
  }
  return queue(slot, room, *total, runs);  // refused: the slot stays acquired, the caller's
}

Result<std::optional<StagedChunk>> StagingRing::poll() {
  if (queued_.empty()) return std::optional<StagedChunk>();
  Queued& q = queued_.front();
  auto done = seam_.query(q.ticket);
  if (done.ok() && !*done) return std::optional<StagedChunk>();
  StagedChunk c = q.chunk;
  if (!done.ok()) c.status = done.status();
  if (Status s = seam_.retire(q.ticket); !s.ok()) return s;
  state_[c.slot] = SlotState::kHandedOut;
  queued_.pop_front();
  return std::optional<StagedChunk>(c);
}

Status StagingRing::release(uint32_t slot) {
  if (slot >= state_.size() || (state_[slot] != SlotState::kHandedOut && state_[slot] != SlotState::kAcquired))
    return Status(ErrorCode::kInvalidArgument, "staging: release of slot " + std::to_string(slot) +
                                                   ", neither handed out nor acquired");
  state_[slot] = SlotState::kFree;
  return Status::Ok();
}

}  // namespace kvferry::device
