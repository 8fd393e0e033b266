// Checks and holds of the segment a peer's rkey names (shm_segments.h).
#include "transport/ucx/shm_segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <string>

namespace kvferry::ucx {
namespace {

Status bad(const std::string& what) { return {ErrorCode::kProtocolError, what}; }
// A well-formed key naming a segment that is not there (any more): the peer is gone, or lies.
Status gone(const std::string& what) { return {ErrorCode::kPeerUnreachable, what}; }

// mm_posix.c (UCX 1.13.1): the file UCX's attach opens for a seg_id (uct_posix_mem_attach_common:
// UCT_POSIX_PROCFS_FILE_FMT, UCT_POSIX_FILE_FMT under shm_open or the configured directory).
int open_posix(const SegmentClaim& c) {
  constexpr uint64_t kProcfs = 1ull << 63, kShmOpen = 1ull << 62;
  char path[4096];
  if (c.flags & kProcfs) {
    const unsigned pid = static_cast<unsigned>(c.id & ((1u << 30) - 1));
    const unsigned fd = static_cast<unsigned>(c.id >> 30);
    std::snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fd);
    return ::open(path, O_RDWR | O_CLOEXEC);
  }
  std::snprintf(path, sizeof path, "/ucx_shm_posix_%" PRIx64, c.id);
  if (c.flags & kShmOpen) return ::shm_open(path, O_RDWR | O_CLOEXEC, 0600);
  return ::open((c.dir + path).c_str(), O_RDWR | O_CLOEXEC);
}

}  // namespace

std::mutex& segment_mapping_lock() {
  static std::mutex lock;
  return lock;
}

SegmentHold& SegmentHold::operator=(SegmentHold&& o) noexcept {
  if (this == &o) return *this;
  release();
  component_ = o.component_;
  sysv_attach_ = o.sysv_attach_;
  inode_ = o.inode_;
  device_ = o.device_;
  o.component_ = UcxComponent::kUnknown;
  o.sysv_attach_ = nullptr;
  return *this;
}

void SegmentHold::release() {
  if (sysv_attach_ != nullptr) {
    std::lock_guard<std::mutex> lock(segment_mapping_lock());
    ::shmdt(sysv_attach_);
  }
  sysv_attach_ = nullptr;
  component_ = UcxComponent::kUnknown;
}

Status SegmentHold::acquire(const SegmentClaim& c) {
  release();
  if (c.component == UcxComponent::kSysv) {
    const int id = static_cast<int>(c.id);
    shmid_ds ds{}, fifo{};
    if (::shmctl(id, IPC_STAT, &ds) != 0) return gone("sysv remote key names no segment this rank can see");
    if (!c.has_peer_fifo || ::shmctl(static_cast<int>(c.peer_fifo), IPC_STAT, &fifo) != 0)
      return gone("the peer's sysv fifo (its worker address) is no segment this rank can see");
    if (ds.shm_cpid != fifo.shm_cpid)
      return bad("sysv remote key names a segment another process than the peer's created");
    void* at = nullptr;
    {
      std::lock_guard<std::mutex> lock(segment_mapping_lock());
      at = ::shmat(id, nullptr, SHM_RDONLY);
    }
    if (at == reinterpret_cast<void*>(-1)) return bad("sysv remote key names a segment this rank cannot attach");
    sysv_attach_ = at;
    component_ = UcxComponent::kSysv;
    inode_ = c.id;
    return Status::Ok();
  }
  if (c.component == UcxComponent::kPosix) {
    const int fd = open_posix(c);
    if (fd < 0) return gone("posix remote key names no segment this rank can open");
    struct stat st {};
    const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) >= c.length;
    ::close(fd);
    if (!ok) return bad("posix remote key claims " + std::to_string(c.length) + " bytes of a shorter segment");
    component_ = UcxComponent::kPosix;
    inode_ = st.st_ino;
    device_ = st.st_dev;
    return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace kvferry::ucx
