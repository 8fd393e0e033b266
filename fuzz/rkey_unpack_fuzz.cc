// A peer's packed rkey, as the validator (src/transport/ucx/ucx_layout.cc check_peer_rkey and
// shm_segments.cc SegmentHold, both as ucx_peers.cc calls them) accepts it, fed to the REAL
// ucp_ep_rkey_unpack of UCX 1.13 through a real endpoint: a validator hole shows as a crash
// (UCX 1.13 segfaults in ucp_rkey_destroy when a component's unpack fails, ucx_layout.h) or as a
// FUZZ_CHECK (an accepted key that UCX refuses).
//
// In this process: one ucp context (posix,sysv,self, RMA) with two workers: the rank (A) and the
// peer (B); B allocates a region the way create_region does; A connects to B's worker address.
// The input's first byte picks what the rest is: 0: the packed rkey itself; otherwise XORed onto
// B's real rkey (of this run: its segment exists), and a length of (byte - 1) extra bytes cut or
// appended. Seeds (fuzz/corpus/rkey_unpack/): real rkeys of this UCX (sysv, posix, registered
// memory) and zero masks (B's real rkey as it is).
#include <stdlib.h>
#include <sanitizer/lsan_interface.h>
#include <ucp/api/ucp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fuzz_util.h"
#include "transport/ucx/shm_segments.h"
#include "transport/ucx/ucx_layout.h"

namespace {

using namespace kvferry::ucx;

struct World {
  ucp_context_h ctx = nullptr;
  ucp_worker_h rank = nullptr, peer = nullptr;
  ucp_ep_h ep = nullptr;
  std::string real_rkey;
  LocalUcxLayout local;
  WorkerAddressLayout peer_address;
};

std::string worker_address(ucp_worker_h w) {
  ucp_address_t* a = nullptr;
  size_t n = 0;
  FUZZ_CHECK(ucp_worker_get_address(w, &a, &n) == UCS_OK);
  std::string s(reinterpret_cast<const char*>(a), n);
  ucp_worker_release_address(w, a);
  return s;
}

std::string alloc_and_pack(ucp_context_h ctx) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.length = 1 << 16;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  FUZZ_CHECK(ucp_mem_map(ctx, &mp, &memh) == UCS_OK);  // kept for the process's life
  void* buf = nullptr;
  size_t len = 0;
  FUZZ_CHECK(ucp_rkey_pack(ctx, memh, &buf, &len) == UCS_OK);
  std::string s(static_cast<const char*>(buf), len);
  ucp_rkey_buffer_release(buf);
  return s;
}

World* make_world() {
  // UCX's malloc/mmap hooks and ASan do not mix; the shm error-handling mode is kvferry's
  // (ucx_config.cc enable_shm_error_handling_env).
  setenv("UCX_MEM_MALLOC_HOOKS", "n", 0);
  setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 0);
  setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
  setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
  auto* w = new World;
  ucp_config_t* config = nullptr;
  FUZZ_CHECK(ucp_config_read(nullptr, nullptr, &config) == UCS_OK);
  FUZZ_CHECK(ucp_config_modify(config, "TLS", "posix,sysv,self") == UCS_OK);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  FUZZ_CHECK(ucp_init(&params, config, &w->ctx) == UCS_OK);
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  FUZZ_CHECK(ucp_worker_create(w->ctx, &wp, &w->rank) == UCS_OK);
  FUZZ_CHECK(ucp_worker_create(w->ctx, &wp, &w->peer) == UCS_OK);
  // The rank's layout, learned as UcxTransport::learn_layout does (own address, a probe rkey).
  w->local.shm_only = true;
  FUZZ_CHECK(w->local.learn_address(worker_address(w->rank)).ok());
  FUZZ_CHECK(w->local.learn_rkey(alloc_and_pack(w->ctx)).ok());
  w->real_rkey = alloc_and_pack(w->ctx);  // the peer's region
  const std::string peer_address = worker_address(w->peer);
  FUZZ_CHECK(check_peer_address(w->local, peer_address, &w->peer_address).ok());
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  FUZZ_CHECK(ucp_ep_create(w->rank, &ep, &w->ep) == UCS_OK);
  return w;
}

World* w = nullptr;
uint64_t inputs = 0, accepted = 0, unpacked = 0;  // KVFERRY_FUZZ_STATS=1: printed at exit

void print_stats() {
  std::fprintf(stderr, "rkey_unpack: %llu inputs, %llu accepted by the validator, %llu unpacked by UCX\n",
               static_cast<unsigned long long>(inputs), static_cast<unsigned long long>(accepted),
               static_cast<unsigned long long>(unpacked));
}

}  // namespace

// Built once before the first input (libFuzzer's leak check then sees only per-input allocations).
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  __lsan_disable();  // UCX's own allocations (kept in memory LSan does not scan) are not findings here
  w = make_world();
  __lsan_enable();
  if (getenv("KVFERRY_FUZZ_STATS") != nullptr) std::atexit(print_stats);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  ++inputs;
  std::string rkey;
  if (data[0] == 0) {
    rkey.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    rkey = w->real_rkey;
    for (size_t i = 1; i < size && i - 1 < rkey.size(); ++i) rkey[i - 1] ^= static_cast<char>(data[i]);
    const int delta = static_cast<int>(data[0]) - 128;  // cut (< 0) or append (> 0) bytes
    if (delta < 0) rkey.resize(rkey.size() - std::min<size_t>(rkey.size(), static_cast<size_t>(-delta)));
    if (delta > 0) rkey.append(static_cast<size_t>(delta), static_cast<char>(data[size - 1]));
  }
  if (rkey.empty()) return 0;  // check_remote_info refuses it before (span_table.cc)
  SegmentClaim claim;
  if (!check_peer_rkey(w->local, w->peer_address, rkey, &claim).ok()) return 0;
  SegmentHold hold;
  if (!hold.acquire(claim).ok()) return 0;
  ++accepted;
  ucp_rkey_h handle = nullptr;
  __lsan_disable();  // UCX caches per-rkey configurations for the worker's life
  const ucs_status_t s = ucp_ep_rkey_unpack(w->ep, rkey.data(), &handle);
  FUZZ_CHECK(s == UCS_OK);  // accepted by the validator: UCX must take it
  ++unpacked;
  void* local = nullptr;
  (void)ucp_rkey_ptr(handle, 0, &local);
  ucp_rkey_destroy(handle);
  __lsan_enable();
  return 0;
}
