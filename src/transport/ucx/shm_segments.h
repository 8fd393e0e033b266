// The shared-memory segment a peer's rkey names, checked and held before UCX attaches it
// (docs/security.md "Remote keys and worker addresses").
//
// UCX 1.13's ucp_ep_rkey_unpack crashes when a component's attach fails (ucx_layout.h). So
// before the unpack, the segment a checked rkey names (SegmentClaim) must exist, be the peer's
// (a sysv segment created by the process that created the peer's UCX fifo; a posix segment of
// the peer's pid, checked in ucx_layout.cc), be as long as the rkey says, and stay attachable
// until the unpack returned: a sysv segment is attached here (read-only) for that time, so its
// owner removing it cannot make UCX's shmat fail (Linux keeps a removed segment attachable while
// it is attached). A posix procfs segment is opened here; its owner closing its descriptor in
// the moment between this check and UCX's own open is the one window left (only the process
// that owns the segment, i.e. the peer itself, can do that; docs/security.md).
//
// Thread contract: one hold per thread; acquire and release on the same thread. Every change
// this process makes to its mappings of peers' segments happens under segment_mapping_lock().
#pragma once
#include <cstdint>
#include <mutex>

#include "kvferry/error.h"
#include "transport/ucx/ucx_layout.h"

namespace kvferry::ucx {

// The one lock under which this process maps and unmaps peers' segments: a hold's attach and
// detach, an rkey's unpack together with the snapshots of /proc/self/maps around it
// (shm_mapping.h new_mappings), and an rkey's destroy. Without it, another transport or shard of
// the process could unmap a mapping of the same segment between one unpack's first snapshot and
// the unpack, and the unpack could map the freed range again: the same range and inode as the
// snapshot's, so the mapping the unpack created looked old and an honest peer was refused (two
// prefill ranks of one process connecting to one decode rank at once).
std::mutex& segment_mapping_lock();

class SegmentHold {
 public:
  SegmentHold() = default;
  SegmentHold(const SegmentHold&) = delete;
  SegmentHold& operator=(const SegmentHold&) = delete;
  SegmentHold(SegmentHold&& o) noexcept { *this = std::move(o); }
  SegmentHold& operator=(SegmentHold&& o) noexcept;
  ~SegmentHold() { release(); }

  // Errors: kPeerUnreachable (no such segment: the peer is gone), kProtocolError (not the peer's,
  // shorter than claimed, not a file).
  // A claim of component kUnknown (no segment) holds nothing and succeeds.
  Status acquire(const SegmentClaim& claim);
  void release();
  bool holds_segment() const { return component_ != UcxComponent::kUnknown; }
  // What /proc/self/maps shows for a mapping of this segment: sysv: inode = shmid (any device);
  // posix: the file's device and inode.
  uint64_t inode() const { return inode_; }
  bool check_device() const { return component_ == UcxComponent::kPosix; }
  uint64_t device() const { return device_; }

 private:
  UcxComponent component_ = UcxComponent::kUnknown;
  void* sysv_attach_ = nullptr;
  uint64_t inode_ = 0;
  uint64_t device_ = 0;
};

}  // namespace kvferry::ucx
