// One-page rooms at concurrency 1 through the public API only (kvferry/manager.h), as an engine
// drives it: a prefill and a decode Manager in this process, each with its progress thread, over
// shm or tcp on loopback, behind a real bootstrap service. Per room: decode receiver(room), init();
// prefill sender(room); then the timed part, issue 30's "send_metadata to Success": decode
// send_metadata(one page), prefill waits for WaitingForInput, init(1), send(the page, last), decode
// polls until Success. Reported: mean (Google Benchmark's time) and p50 / p90 / p99 / max in us.
// The geometry is small (2 layers, 2 KV heads of 64, bf16, 16 tokens a page: one page is 16 KiB).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/bootstrap.h"
#include "kvferry/manager.h"

namespace kvferry {
namespace {

ManagerConfig config(Role role, const std::string& transport, const std::string& bootstrap) {
  ManagerConfig c;
  c.self = {role, 0, 0, 0};
  c.model = {"bench-small", "GQA", 2, 2, 2, 64, 2};
  c.page_size = 16;
  c.pool_bytes = 8ull << 20;
  c.aux_rows = 64;
  c.transport = transport;
  c.bootstrap_address = bootstrap;
  c.progress_interval_ms = 5;
  return c;
}

template <typename P>
bool spin_until(P pred, std::chrono::seconds timeout = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

void BM_OnePageRoom(benchmark::State& state, const std::string& transport) {
  auto server = BootstrapServer::start("127.0.0.1", 0);
  if (!server.ok()) return state.SkipWithError(server.status().str().c_str());
  const std::string bootstrap = "127.0.0.1:" + std::to_string((*server)->port());
  auto p = Manager::create(config(Role::kPrefill, transport, bootstrap));
  if (!p.ok()) return state.SkipWithError(p.status().str().c_str());
  auto d = Manager::create(config(Role::kDecode, transport, bootstrap));
  if (!d.ok()) return state.SkipWithError(d.status().str().c_str());
  std::unique_ptr<Manager> prefill = std::move(p).value(), decode = std::move(d).value();
  if (!spin_until([&] { return prefill->stats().peers == 1; })) return state.SkipWithError("no peer");
  // The room's time in three stages (where it goes): decode's metadata until prefill's poll says
  // WaitingForInput (control frame decode -> prefill, prefill's progress); init + send calls; the
  // writes, prefill's status frame and decode's progress until decode's poll says Success.
  std::vector<double> init_us, us, meta_us, call_us, land_us;
  uint64_t room = 1;
  for (auto _ : state) {
    ++room;
    auto rx = decode->receiver(room).value();
    if (!rx->init().ok()) return state.SkipWithError("receiver init");
    auto tx = prefill->sender(room).value();
    const std::vector<uint64_t> dst{room % 64}, src{(room + 7) % 64};
    const auto t0 = std::chrono::steady_clock::now();
    if (!rx->send_metadata(dst, room % 64, {}).ok()) return state.SkipWithError("send_metadata");
    if (!spin_until([&] { return tx->poll() == KVPoll::WaitingForInput; })) return state.SkipWithError("metadata");
    const auto t1 = std::chrono::steady_clock::now();
    if (!tx->init(1, room % 64).ok()) return state.SkipWithError("send");
    const auto t15 = std::chrono::steady_clock::now();
    if (!tx->send(src, {}, true).ok()) return state.SkipWithError("send");
    const auto t2 = std::chrono::steady_clock::now();
    init_us.push_back(std::chrono::duration<double, std::micro>(t15 - t1).count());
    if (!spin_until([&] { return rx->poll() == KVPoll::Success; })) return state.SkipWithError("success");
    const auto t3 = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t3 - t0).count();
    state.SetIterationTime(s);
    us.push_back(s * 1e6);
    meta_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    call_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    land_us.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
  }
  auto at = [](std::vector<double>& v, double q) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, size_t(q * v.size()))];
  };
  state.counters["p50_us"] = at(us, 0.50);
  state.counters["p90_us"] = at(us, 0.90);
  state.counters["p99_us"] = at(us, 0.99);
  state.counters["max_us"] = us.empty() ? 0.0 : us.back();
  state.counters["meta_p50_us"] = at(meta_us, 0.50);
  state.counters["call_p50_us"] = at(call_us, 0.50);
  state.counters["init_p50_us"] = at(init_us, 0.50);
  state.counters["land_p50_us"] = at(land_us, 0.50);
}

// The cost of an engine's poll of a room that waits (SGLang polls every room of its queues each
// step): 256 decode rooms whose metadata went out and whose prefill never sends. Time per poll();
// a poll of a waiting room may run the manager's progress (ManagerImpl::progress_inline).
void BM_PollWaitingRooms(benchmark::State& state) {
  auto server = BootstrapServer::start("127.0.0.1", 0);
  if (!server.ok()) return state.SkipWithError(server.status().str().c_str());
  const std::string bootstrap = "127.0.0.1:" + std::to_string((*server)->port());
  auto p = Manager::create(config(Role::kPrefill, "shm", bootstrap));
  if (!p.ok()) return state.SkipWithError(p.status().str().c_str());
  auto d = Manager::create(config(Role::kDecode, "shm", bootstrap));
  if (!d.ok()) return state.SkipWithError(d.status().str().c_str());
  std::unique_ptr<Manager> prefill = std::move(p).value(), decode = std::move(d).value();
  if (!spin_until([&] { return prefill->stats().peers == 1; })) return state.SkipWithError("no peer");
  std::vector<std::unique_ptr<Receiver>> rooms;
  for (uint64_t room = 1; room <= 256; ++room) {
    auto rx = decode->receiver(room).value();
    if (!rx->init().ok()) return state.SkipWithError("receiver init");
    const std::vector<uint64_t> dst{room % 64};
    if (!rx->send_metadata(dst, room % 64, {}).ok()) return state.SkipWithError("send_metadata");
    rooms.push_back(std::move(rx));
  }
  for (auto _ : state) {
    for (auto& rx : rooms) benchmark::DoNotOptimize(rx->poll());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(rooms.size()));
}

BENCHMARK(BM_PollWaitingRooms)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_OnePageRoom, shm, std::string("shm"))->UseManualTime()->Iterations(2000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_OnePageRoom, tcp, std::string("tcp"))->UseManualTime()->Iterations(2000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvferry

BENCHMARK_MAIN();
