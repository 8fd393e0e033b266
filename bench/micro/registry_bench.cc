// FailureRegistry (include/kvferry/registry.h): the per-room bookkeeping every rank does for every
// room (open, lookup on the hot path, release) and the failure path (record, get). Arg: rooms open
// at once (the per-room cost must not grow with it).
#include <benchmark/benchmark.h>

#include <cstdint>

#include "kvferry/registry.h"

namespace {
using namespace kvferry;
const RankId kSelf{Role::kPrefill, 0, 0, 0};
const RankId kPeer{Role::kDecode, 0, 1, 0};

void BM_OpenLookupRelease(benchmark::State& state) {
  FailureRegistry reg(kSelf);
  const uint64_t live = static_cast<uint64_t>(state.range(0));
  for (uint64_t r = 0; r < live; ++r) reg.open(r);
  uint64_t next = live;
  for (auto _ : state) {  // the room lifecycle at steady state: one in, one out
    reg.open(next);
    benchmark::DoNotOptimize(reg.get(next));
    reg.release(next - live);
    ++next;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_OpenLookupRelease)->Arg(16)->Arg(1024)->Arg(65536);

void BM_RecordAndGet(benchmark::State& state) {
  FailureRegistry reg(kSelf);
  const uint64_t live = static_cast<uint64_t>(state.range(0));
  for (uint64_t r = 0; r < live; ++r) reg.open(r);
  uint64_t next = live;
  for (auto _ : state) {
    reg.open(next);
    reg.record(next, ErrorCode::kTransferError, "injected transfer error", kPeer, 42);
    reg.record(next, ErrorCode::kPeerUnreachable, "second cause", kSelf, 43);  // kept as secondary
    auto e = reg.get(next);
    benchmark::DoNotOptimize(e);
    reg.release(next - live);
    ++next;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RecordAndGet)->Arg(16)->Arg(1024)->Arg(65536);

}  // namespace

BENCHMARK_MAIN();
