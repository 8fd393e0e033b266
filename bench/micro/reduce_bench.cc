// Engine-wide state reduction (src/driver/reduce.cc, reduce_room): the leader reduces every live
// room's reports from every TP rank each step. Arg: TP ranks reporting the room.
#include <benchmark/benchmark.h>

#include <vector>

#include "driver/engine.h"

namespace {
using namespace kvferry;

std::vector<RoomReport> reports(int ranks, bool failing) {
  std::vector<RoomReport> v;
  for (int i = 0; i < ranks; ++i) {
    RoomReport r;
    r.room = 77;
    r.tp_rank = static_cast<uint32_t>(i);
    r.poll = KVPoll::Transferring;
    r.send_ns = 1000 + i;
    r.bytes = 1 << 20;
    if (failing && i == ranks - 1) {
      r.poll = KVPoll::Failed;
      r.has_failure = true;
      r.code = ErrorCode::kTransferError;
      r.origin = "prefill/tp" + std::to_string(i);
      r.reason = "injected transfer error";
      r.first_seen_ns = 5;
      r.failed_ns = 6;
    }
    v.push_back(std::move(r));
  }
  return v;
}

void BM_ReduceRoom(benchmark::State& state, bool failing) {
  auto reps = reports(static_cast<int>(state.range(0)), failing);
  for (auto _ : state) {
    RoomReduction red = reduce_room(reps);
    benchmark::DoNotOptimize(red.min_poll);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_CAPTURE(BM_ReduceRoom, ok, false)->Arg(1)->Arg(2)->Arg(4)->Arg(8);
BENCHMARK_CAPTURE(BM_ReduceRoom, failing, true)->Arg(1)->Arg(2)->Arg(4)->Arg(8);

}  // namespace

BENCHMARK_MAIN();
