// Checks of a peer's shared-memory span as this process maps it (shm_mapping.h).
#include "transport/ucx/shm_mapping.h"

#include <fcntl.h>
#include <unistd.h>

#include <cinttypes>
#include <sys/sysmacros.h>

#include <cstdio>
#include <string>

namespace kvferry::ucx {
namespace {

// Whether this process can read the byte at `addr` without a fault: the kernel copies it into a
// pipe and reports a hole (unmapped, or a shared file mapping past its file's end) as EFAULT
// instead of raising SIGSEGV or SIGBUS. (A pipe, not process_vm_readv: container seccomp
// profiles often forbid that one.)
bool readable(uintptr_t addr) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  const bool ok = write(fds[1], reinterpret_cast<const void*>(addr), 1) == 1;
  close(fds[0]);
  close(fds[1]);
  return ok;
}

}  // namespace

namespace {

bool parse_line(const char* line, Mapping* m) {
  uintptr_t lo = 0, hi = 0;
  char perms[5] = {};
  unsigned long long offset = 0, inode = 0;
  unsigned major_id = 0, minor_id = 0;
  if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %llx %x:%x %llu", &lo, &hi, perms, &offset, &major_id,
                  &minor_id, &inode) != 7)
    return false;
  *m = {lo, hi, perms[3] == 's', perms[1] == 'w', makedev(major_id, minor_id), inode};
  return true;
}

template <class F>
void each_mapping(F&& f) {
  FILE* file = std::fopen("/proc/self/maps", "re");
  if (file == nullptr) return;
  char line[4096];
  Mapping m;
  while (std::fgets(line, sizeof line, file) != nullptr) {
    if (parse_line(line, &m) && !f(m)) break;
  }
  std::fclose(file);
}

}  // namespace

bool find_mapping(uintptr_t addr, Mapping* out) {
  bool found = false;
  each_mapping([&](const Mapping& m) {
    if (addr < m.start || addr >= m.end) return true;
    *out = m;
    found = true;
    return false;
  });
  return found;
}

std::vector<Mapping> read_mappings() {
  std::vector<Mapping> all;
  each_mapping([&](const Mapping& m) {
    all.push_back(m);
    return true;
  });
  return all;
}

std::vector<Mapping> new_mappings(const std::vector<Mapping>& before, const std::vector<Mapping>& after,
                                  uint64_t inode, bool check_device, uint64_t device) {
  std::vector<Mapping> fresh;
  for (const Mapping& m : after) {
    if (m.inode != inode || (check_device && m.device != device)) continue;
    bool old = false;
    for (const Mapping& b : before) old = old || (b.start == m.start && b.end == m.end && b.inode == m.inode);
    if (!old) fresh.push_back(m);
  }
  return fresh;
}

Status check_peer_mapping(const void* local, uint64_t bytes, const std::vector<AddressRange>& taken,
                          const std::vector<Mapping>* fresh) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(local);
  if (bytes == 0 || lo > UINTPTR_MAX - bytes) return {ErrorCode::kProtocolError, "span overflows the address space"};
  const uintptr_t hi = lo + bytes;
  Mapping m;
  if (!find_mapping(lo, &m)) return {ErrorCode::kProtocolError, "span is not mapped here"};
  if (hi > m.end) {
    return {ErrorCode::kProtocolError, "span of " + std::to_string(bytes) + " bytes runs " +
                                           std::to_string(hi - m.end) + " bytes past the peer's mapped segment"};
  }
  if (!m.shared || !m.writable) return {ErrorCode::kProtocolError, "span is not in a shared writable mapping"};
  if (fresh != nullptr) {
    bool created = false;
    for (const Mapping& f : *fresh) created = created || (f.start == m.start && f.end == m.end && f.inode == m.inode);
    if (!created) return {ErrorCode::kProtocolError, "span is not in the mapping its remote key's unpack created"};
  }
  for (const AddressRange& t : taken) {
    if (t.first < m.end && m.start < t.second)
      return {ErrorCode::kProtocolError, "span is in memory this rank already maps for itself or another peer"};
  }
  // The same memory under another address: a second mapping of a segment that holds a taken range.
  if (!taken.empty()) {
    for (const Mapping& other : read_mappings()) {
      if (!other.shared || other.inode == 0 || other.inode != m.inode || other.device != m.device) continue;
      if (other.start == m.start && other.end == m.end) continue;
      for (const AddressRange& t : taken)
        if (t.first < other.end && other.start < t.second)
          return {ErrorCode::kProtocolError, "span maps a segment this rank already maps for itself or another peer"};
    }
  }
  if (!readable(lo) || !readable(hi - 1)) return {ErrorCode::kProtocolError, "span is not backed up to its end"};
  return Status::Ok();
}

}  // namespace kvferry::ucx
