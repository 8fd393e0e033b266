// WriteFence: the receiver-side room fence of the data path (docs/security.md "The room fence",
// docs/failure-model.md "Late writes"). A decode rank installs one into its transport
// (Transport::set_write_fence). Where the receiver's transport copies incoming writes itself
// (tcp), it places a write only if the room the write names is open here and every byte of it lies
// inside that room's byte ranges (its pages, aux row, guard row and state rows, in this rank's
// offset space); anything else is refused, nothing written.
//
// A room is open from open() (the receiver has pages for it) until close() (its pages were
// released or quarantined). A placement holds a Pin on the room from its check until its bytes
// are in place (for a rendezvous receive: until the data arrived), so close() can tell the caller
// how many placements of the room are still running; pinned() says when they are all done, after
// which nothing of that room can touch its pages any more.
//
// Cost on the receiver's progress thread, per incoming message: pin() is one mutex-protected hash
// lookup and a counter increment (no allocation); contains() is a binary search over the room's
// coalesced ranges without any lock (an open room's ranges never change while it is pinned); the
// Pin's release is one more short critical section.
//
// Thread contract: every method may be called from any thread. open/close/pinned come from the
// endpoint's thread, pin/contains/release from transport progress threads.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kvferry/error.h"

namespace kvferry {

// [offset, offset + bytes) in a rank's offset space.
struct FenceRange {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Why a write was refused (also the refusal code of the tcp acknowledgement, docs/transport.md).
enum class FenceVerdict : uint8_t {
  kAdmitted = 0,
  kRoomClosed = 1,   // the room is not open here (never given pages, released or quarantined)
  kOutsideRoom = 2,  // the room is open but the write touches bytes that are not its own
};
const char* fence_verdict_name(FenceVerdict v);

class WriteFence {
  struct Entry {
    std::vector<FenceRange> ranges;  // sorted, coalesced, non-empty ranges; immutable while open
    bool open = false;
    uint64_t pins = 0;
  };

 public:
  // Held by one placement of a room; releases the room on destruction. Empty when refused.
  class Pin {
   public:
    Pin() = default;
    Pin(Pin&& o) noexcept : fence_(o.fence_), entry_(o.entry_), room_(o.room_) {
      o.fence_ = nullptr;
      o.entry_ = nullptr;
    }
    Pin& operator=(Pin&& o) noexcept;
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;
    ~Pin() { release(); }
    explicit operator bool() const { return entry_ != nullptr; }
    uint64_t room() const { return room_; }
    // Whether [offset, offset + bytes) lies inside ONE of the room's coalesced ranges
    // (overflow-safe; false on an empty Pin). A zero-length write must lie inside a range too.
    bool contains(uint64_t offset, uint64_t bytes) const;
    void release();

   private:
    friend class WriteFence;
    Pin(WriteFence* f, const Entry* e, uint64_t room) : fence_(f), entry_(e), room_(room) {}
    WriteFence* fence_ = nullptr;
    const Entry* entry_ = nullptr;
    uint64_t room_ = 0;
  };

  // Opens `room` for writes into `ranges` (sorted and coalesced here: touching or overlapping
  // ranges become one; empty ranges are dropped). Errors (kInvalidArgument, nothing changed): a
  // range whose end overflows, no non-empty range, the room is already open, or placements of an
  // earlier opening of the same room id are still running.
  Status open(uint64_t room, std::vector<FenceRange> ranges);
  // Closes `room`: later writes naming it are refused. Returns how many placements of it are
  // still running (their bytes may still arrive; pinned() says when they are done). Unknown room:
  // 0.
  uint64_t close(uint64_t room);
  bool is_open(uint64_t room) const;
  // Placements of `room` still running (0 for an unknown room).
  uint64_t pinned(uint64_t room) const;
  // Open rooms.
  size_t open_rooms() const;
  // The room's coalesced ranges (empty if not open); for tests and diagnostics.
  std::vector<FenceRange> ranges(uint64_t room) const;

  // Progress threads: a Pin on `room` if it is open, else an empty Pin (refuse: kRoomClosed).
  Pin pin(uint64_t room);
  // Counts a refusal (the transport calls it once per refused message).
  void count_refusal(FenceVerdict v);
  uint64_t refused() const { return refused_closed_.load() + refused_outside_.load(); }
  uint64_t refused_closed() const { return refused_closed_.load(); }
  uint64_t refused_outside() const { return refused_outside_.load(); }

 private:
  void unpin(uint64_t room);

  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<Entry>> rooms_;  // open or still pinned
  size_t open_ = 0;
  std::atomic<uint64_t> refused_closed_{0}, refused_outside_{0};
};

}  // namespace kvferry
