// Bounded pinned staging for the path across hosts (docs/gpu.md, "Staged path"; issue 32 item 4),
// written against the device-copy seam so that it runs on CPU with the host implementation. Not
// wired into a transport yet.
//
// A ring of `slots` pinned host buffers of `slot_bytes` each, allocated once through the seam:
//   prefill  gather(room, pieces): a free slot receives a chunk's scattered device pieces, packed
//            in order (one copy batch); when poll() hands the chunk out, the slot's bytes go to the
//            network, and release(slot) returns it.
//   decode   acquire(): a free slot for bytes from the network; scatter(slot, room, pieces) copies
//            them to their device pieces (one copy batch); poll() says when they landed, then
//            release(slot).
// Staging memory is bounded (slots x slot_bytes; no slot free: gather/acquire answer "none", the
// caller keeps the chunk and tries again: back-pressure, never growth). Several chunks are in
// flight at once (the copies overlap the network), and poll() hands chunks out in the order they
// were queued: a room's chunks keep their order. A chunk whose copies failed is handed out with
// their error; its slot is released like any other.
//
// Thread contract: one thread (the owner's), like the seam it uses.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "device/device_copy.h"

namespace kvferry::device {

constexpr uint32_t kMaxStagingSlots = 256;

// A piece of device memory: [address, address + bytes) of the ring's device.
struct DevicePiece {
  uint64_t address = 0;
  uint64_t bytes = 0;
};

struct StagedChunk {
  uint64_t room = 0;
  uint32_t slot = 0;
  uint64_t bytes = 0;  // packed bytes in the slot
  Status status;       // non-ok: the chunk's copies failed
};

class StagingRing {
 public:
  // kInvalidArgument for 0 or more than kMaxStagingSlots slots, a zero slot size, or the seam's
  // refusal of the device; the seam's allocation error otherwise.
  static Result<std::unique_ptr<StagingRing>> create(DeviceCopy& seam, int32_t device, uint32_t stream,
                                                     uint64_t slot_bytes, uint32_t slots);
  ~StagingRing();  // waits out copies in flight, then frees the slots
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Device -> slot. The slot used, or nullopt when none is free. kInvalidArgument when the pieces
  // do not fit one slot (or the seam refuses the batch); nothing is queued then.
  Result<std::optional<uint32_t>> gather(uint64_t room, std::span<const DevicePiece> pieces);
  // A free slot for bytes from the network (nullopt: none), and its memory.
  std::optional<uint32_t> acquire();
  uint8_t* slot_memory(uint32_t slot) const;
  // Slot (acquired, holding the pieces' bytes packed in order) -> device.
  Status scatter(uint32_t slot, uint64_t room, std::span<const DevicePiece> pieces);
  // The oldest queued chunk once its copies are complete (nullopt: none queued, or the oldest is
  // still in flight).
  Result<std::optional<StagedChunk>> poll();
  // Returns a slot handed out by poll() or acquired and not scattered.
  Status release(uint32_t slot);

  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t free_slots() const;

 private:
  enum class SlotState : uint8_t { kFree, kAcquired, kQueued, kHandedOut };
  struct Queued {
    StagedChunk chunk;
    CopyTicket ticket;
  };
  StagingRing(DeviceCopy& seam, int32_t device, uint32_t stream, uint64_t slot_bytes);
  Result<uint64_t> packed_bytes(std::span<const DevicePiece> pieces) const;
  Status queue(uint32_t slot, uint64_t room, uint64_t bytes, const std::vector<CopyRun>& runs);

  DeviceCopy& seam_;
  const int32_t device_;
  const uint32_t stream_;
  const uint64_t slot_bytes_;
  std::vector<uint64_t> memory_;  // pinned, one per slot
  std::vector<SlotState> state_;
  std::deque<Queued> queued_;
};

}  // namespace kvferry::device
