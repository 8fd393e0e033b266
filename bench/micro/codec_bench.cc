// Control-plane message codec (include/kvferry/messages.h, src/control): encode and decode of the
// per-room frames. RoomMetadata carries one kv_index per page (N pages), RoomStatus a reason text.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "kvferry/messages.h"

namespace {
using namespace kvferry;

RoomMetadata metadata(uint64_t pages) {
  RoomMetadata m;
  m.room = 123456789;
  m.sender = {Role::kDecode, 0, 3, 0};
  for (uint64_t i = 0; i < pages; ++i) m.kv_indices.push_back(1000 + i);
  m.aux_index = 17;
  m.expected_senders = 2;
  m.incarnation = 1'764'000'000'000'000'001ull;  // every rank has one (kvferry/messages.h); 0 is refused
  m.peer_incarnation = 1'764'000'000'000'000'002ull;
  return m;
}

RoomStatus status(bool failed) {
  RoomStatus s;
  s.room = 123456789;
  s.sender = {Role::kPrefill, 0, 1, 0};
  s.state = failed ? KVPoll::Failed : KVPoll::Success;
  s.failure.code = failed ? ErrorCode::kTransferError : ErrorCode::kOk;
  s.failure.origin = {Role::kPrefill, 0, 1, 0};
  s.failure.first_seen_ns = 42;
  if (failed) s.failure.reason = "injected transfer error (replay fault plan)";
  s.incarnation = 1'764'000'000'000'000'003ull;
  s.peer_incarnation = 1'764'000'000'000'000'004ull;
  return s;
}

void BM_EncodeMetadata(benchmark::State& state) {
  Message m = metadata(static_cast<uint64_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(encode(m));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EncodeMetadata)->Arg(1)->Arg(64)->Arg(512)->Arg(4096);

void BM_DecodeMetadata(benchmark::State& state) {
  const std::string frame = encode(Message{metadata(static_cast<uint64_t>(state.range(0)))});
  if (auto first = decode(frame); !first.ok()) {  // measure the decode, not a refusal
    state.SkipWithError(("the frame does not decode: " + first.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    auto m = decode(frame);
    benchmark::DoNotOptimize(m.ok());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * frame.size()));
}
BENCHMARK(BM_DecodeMetadata)->Arg(1)->Arg(64)->Arg(512)->Arg(4096);

void BM_StatusRoundTrip(benchmark::State& state) {
  Message m = status(state.range(0) != 0);
  if (auto first = decode(encode(m)); !first.ok()) {
    state.SkipWithError(("the frame does not decode: " + first.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    auto back = decode(encode(m));
    benchmark::DoNotOptimize(back.ok());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_StatusRoundTrip)->ArgName("failed")->Arg(0)->Arg(1);

void BM_DecodeGarbage(benchmark::State& state) {  // a rejected frame must be cheap too
  std::string frame = encode(Message{metadata(64)});
  frame[frame.size() / 2] ^= 0x5a;
  frame.resize(frame.size() - 3);
  for (auto _ : state) {
    auto m = decode(frame);
    benchmark::DoNotOptimize(m.ok());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DecodeGarbage);

}  // namespace

BENCHMARK_MAIN();
