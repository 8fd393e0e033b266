// Locked, pre-faulted, huge-page-advised memory (residency.h; docs/transport.md "Resident memory").
#include "core/residency.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14 (include/uapi/asm-generic/mman-common.h)
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvferry {
namespace {

bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::strcmp(v, "0") == 0 || std::strcmp(v, "no") == 0 || std::strcmp(v, "off") == 0);
}

std::string memlock_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(rl.rlim_cur / 1024) + " KiB";
}

void append(std::string& warning, const std::string& what) {
  if (!warning.empty()) warning += "; ";
  warning += what;
}

}  // namespace

ResidencyOptions residency_options_from_env() {
  ResidencyOptions o;
  o.lock = !env_off("KVFERRY_POOL_LOCK");
  o.prefault = !env_off("KVFERRY_POOL_PREFAULT");
  o.huge_pages = !env_off("KVFERRY_POOL_HUGEPAGES");
  return o;
}

std::string transparent_hugepage_mode(bool shared) {
  std::ifstream f(shared ? "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
                         : "/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return {};
  const auto open = line.find('[');
  const auto close = line.find(']', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || close == std::string::npos) return {};
  return line.substr(open + 1, close - open - 1);
}

ResidencyResult make_resident(void* base, uint64_t bytes, bool shared, const ResidencyOptions& options) {
  ResidencyResult r;
  if (base == nullptr || bytes == 0) return r;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<uintptr_t>(base) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(base) + bytes;
  if (end < lo) return r;  // wrapped: nothing sensible to do
  const uintptr_t hi = (end + page - 1) & ~(page - 1);
  void* const start = reinterpret_cast<void*>(lo);
  const size_t length = hi - lo;

  if (options.huge_pages) {
    // Asked before the pages are faulted in, so they can be allocated huge. The policy decides
    // whether the advice is taken ("never" ignores it; "always" does not need it).
    const std::string mode = transparent_hugepage_mode(shared);
    const bool allowed = mode == "always" || mode == "madvise" || mode == "advise" || mode == "within_size" ||
                         mode == "force";
    if (madvise(start, length, MADV_HUGEPAGE) == 0 && allowed) {
      r.huge_pages = true;
    } else if (!allowed) {
      append(r.note, std::string("huge pages unavailable: transparent_hugepage/") +
                            (shared ? "shmem_enabled" : "enabled") + " is " +
                            (mode.empty() ? "unreadable" : mode) + ", 4 KiB pages are used");
    }
  }
  if (options.prefault) {
    // Faults every page in writable without changing its content (Linux 5.14+). On older kernels
    // mlock below faults them in; without either, reading each page maps it.
    if (madvise(start, length, MADV_POPULATE_WRITE) == 0) r.prefaulted = true;
  }
  if (options.lock) {
    if (mlock(start, length) == 0) {
      r.locked = true;
      r.prefaulted = true;  // mlock faults in every page of the range
    } else {
      const int e = errno;
      append(r.warning, "mlock of " + std::to_string(length) + " bytes failed (" + std::strerror(e) +
                            "; RLIMIT_MEMLOCK " + memlock_limit() +
                            "): raise it (ulimit -l, LimitMEMLOCK=) or grant CAP_IPC_LOCK; pages may be "
                            "reclaimed and faulted in again during transfers");
    }
  }
  if (options.prefault && !r.prefaulted) {
    if (madvise(start, length, MADV_POPULATE_READ) != 0) {
      const volatile uint8_t* p = reinterpret_cast<const volatile uint8_t*>(lo);
      for (uintptr_t off = 0; off < length; off += page) (void)p[off];
    }
    r.prefaulted = true;
  }
  return r;
}

}  // namespace kvferry
