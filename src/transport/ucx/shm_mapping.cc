// Checks of a peer's shared-memory span as this process maps it (shm_mapping.h).
#include "transport/ucx/shm_mapping.h"

#include <fcntl.h>
#include <unistd.h>

#include <cinttypes>
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

bool find_mapping(uintptr_t addr, Mapping* out) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[4096];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr) {
    uintptr_t lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) != 3) continue;
    if (addr < lo || addr >= hi) continue;
    *out = {lo, hi, perms[3] == 's', perms[1] == 'w'};
    found = true;
  }
  std::fclose(f);
  return found;
}

Status check_peer_mapping(const void* local, uint64_t bytes, const std::vector<AddressRange>& taken) {
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
  for (const AddressRange& t : taken) {
    if (t.first < m.end && m.start < t.second)
      return {ErrorCode::kProtocolError, "span is in memory this rank already maps for itself or another peer"};
  }
  if (!readable(lo) || !readable(hi - 1)) return {ErrorCode::kProtocolError, "span is not backed up to its end"};
  return Status::Ok();
}

}  // namespace kvferry::ucx
