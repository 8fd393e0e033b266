// Page-run coalescing (src/endpoint/coalesce.h): (src, dst) page pairs -> runs -> one WriteOp per
// run per layer buffer. Sizes: a room of N pages, Llama-3.1-8B at TP 1 (64 buffers, 64-token pages
// of 128 KiB). Contiguous = both sides one run (the common case: the page allocators hand out
// lowest-first runs); fragmented = every other destination page (worst case: one run per page).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "endpoint/coalesce.h"

namespace {
using kvferry::PoolOffsets;

constexpr uint32_t kBuffers = 64;
constexpr uint64_t kPageBytes = 128 * 1024;

std::vector<uint64_t> iota(uint64_t n, uint64_t first, uint64_t step);

// Offsets of evenly spaced buffers (a contiguous pool of `pages` pages a buffer).
std::vector<uint64_t> pool_offsets(uint64_t pages) { return iota(kBuffers, 0, kPageBytes * pages); }

std::vector<uint64_t> iota(uint64_t n, uint64_t first, uint64_t step) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = first + i * step;
  return v;
}

void BM_CoalescePages(benchmark::State& state, uint64_t dst_step) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  auto src = iota(n, 0, 1), dst = iota(n, 7, dst_step);
  for (auto _ : state) {
    auto runs = kvferry::coalesce_pages(src, dst);
    benchmark::DoNotOptimize(runs.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));  // pages
}
BENCHMARK_CAPTURE(BM_CoalescePages, contiguous, 1)->RangeMultiplier(8)->Range(8, 4096);
BENCHMARK_CAPTURE(BM_CoalescePages, fragmented, 2)->RangeMultiplier(8)->Range(8, 4096);

void BM_RunsToWrites(benchmark::State& state, uint64_t dst_step) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  auto runs = kvferry::coalesce_pages(iota(n, 0, 1), iota(n, 7, dst_step));
  const auto lo = pool_offsets(8192), ro = pool_offsets(16384);
  PoolOffsets local{kPageBytes, lo}, remote{kPageBytes, ro};
  for (auto _ : state) {
    auto ops = kvferry::runs_to_writes(runs, local, remote);
    benchmark::DoNotOptimize(ops.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));  // pages (x 64 buffers)
}
BENCHMARK_CAPTURE(BM_RunsToWrites, contiguous, 1)->RangeMultiplier(8)->Range(8, 4096);
BENCHMARK_CAPTURE(BM_RunsToWrites, fragmented, 2)->RangeMultiplier(8)->Range(8, 512);

}  // namespace

BENCHMARK_MAIN();
