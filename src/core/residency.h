// Keeping registered memory resident: locked, pre-faulted, huge pages where the system allows
// (docs/transport.md "Resident memory").
//
// A transfer into memory whose pages are not mapped in the copying process pays a page fault per
// 4 KiB inside the copy; pages the kernel ages and unmaps are faulted in again at steady state.
// Real engines' pools do not fault (RDMA registration pins them, GPU memory has no page faults),
// so kvferry makes its pools behave the same: every page is faulted in (writable) before the
// registration is used, and locked (mlock) so the kernel neither reclaims nor unmaps it.
//
// Locking needs CAP_IPC_LOCK (root has it) or an RLIMIT_MEMLOCK (`ulimit -l`, systemd's
// LimitMEMLOCK=, docker's --ulimit memlock=) at least the size of the pools. Without it the memory
// is still pre-faulted, the result says `locked = false` with a warning naming the limit, and the
// caller counts the bytes as unlocked (TransportStats::unlocked_bytes).
// Huge pages: MADV_HUGEPAGE is asked for; whether the kernel uses them for the mapping depends on
// /sys/kernel/mm/transparent_hugepage/{enabled,shmem_enabled} (`huge_pages` says what the policy
// allows; "never" is reported, not an error).
//
// Thread contract: free functions, any thread. make_resident may take a while (about 1 s per few
// GiB that must be zeroed): call it at registration, never on a transfer's path.
#pragma once
#include <cstdint>
#include <string>

namespace kvferry {

struct ResidencyOptions {
  bool lock = true;        // mlock the range
  bool prefault = true;    // fault every page in, writable, before returning
  bool huge_pages = true;  // madvise(MADV_HUGEPAGE)
};

struct ResidencyResult {
  bool locked = false;      // the whole range is mlock'ed
  bool prefaulted = false;  // every page was faulted in writable (by mlock or MADV_POPULATE_WRITE)
  bool huge_pages = false;  // MADV_HUGEPAGE accepted and the system's policy lets it take effect
  std::string warning;      // non-empty: locking or pre-faulting could not be done, and why (one line)
  std::string note;         // non-empty: why huge pages are not used (a system policy; not a fault)
};

// Options from the environment: KVFERRY_POOL_LOCK=0 turns locking off, KVFERRY_POOL_PREFAULT=0
// pre-faulting, KVFERRY_POOL_HUGEPAGES=0 the huge-page advice (all on by default).
ResidencyOptions residency_options_from_env();

// Makes [base, base + bytes) resident as `options` say. `shared`: the range is a shared mapping
// (shared memory; the shmem huge-page policy applies) rather than private anonymous memory.
// Pre-faulting writes nothing: page contents are unchanged (MADV_POPULATE_WRITE or mlock).
ResidencyResult make_resident(void* base, uint64_t bytes, bool shared, const ResidencyOptions& options);

// The bracketed mode of a transparent_hugepage policy file ("always", "madvise", "advise",
// "never", ...); empty when the file cannot be read.
std::string transparent_hugepage_mode(bool shared);

}  // namespace kvferry
