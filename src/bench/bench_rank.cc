// One `kvferry bench-rank` process (bench.h describes the protocol). The rank is a caller-pumped
// Manager (kvferry/manager.h) driven only through the public Sender/Receiver (bench_loops.cc).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_loops.h"
#include "bench/rank_run.h"
#include "endpoint/topology.h"
#include "kvferry/log.h"
#include "kvferry/manager.h"

namespace kvferry::bench {

int run_bench_rank(const BenchRankOptions& o) {
  const std::string name = rank_name(o.prefill, o.tp_rank);
  RankId self{o.prefill ? Role::kPrefill : Role::kDecode, 0, o.tp_rank, 0};
  // Warnings and above only: a debug line per room would be part of what is measured.
  init_logging({self.str(), o.dir + "/" + name + ".log.jsonl", LogLevel::kWarning, LogLevel::kWarning});

  auto model = load_model_file(o.models_file, o.model);
  if (!model.ok()) return fail_start(model.status().str());
  ModelGeometry m = *model;
  if (o.layers) m.num_layers = std::min(m.num_layers, o.layers);
  const uint32_t prefill_tp = o.prefill ? o.tp_size : o.peer_tp_size;
  const uint32_t decode_tp = o.prefill ? o.peer_tp_size : o.tp_size;
  auto plan = plan_transfers(m, prefill_tp, decode_tp);
  if (!plan.ok()) return fail_start(plan.status().str());
  // Pool: `concurrency` rooms of pages (decode: destination pages; prefill: staging), aux slots.
  const uint32_t aux_slots = std::max<uint32_t>(64, 2 * o.concurrency);
  auto probe = make_layout(m, o.tp_size, o.tp_rank, o.page_size, 1ull << 50, aux_slots);
  if (!probe.ok()) return fail_start(probe.status().str());
  const uint64_t pages = probe->pages_for(o.tokens) * o.concurrency;
  const uint64_t pool_bytes = pages * probe->page_bytes() * probe->num_buffers() + aux_slots * kAuxSlotBytes;

  ManagerConfig mc;
  mc.self = self;
  mc.tp_size = o.tp_size;
  mc.peer_tp_size = o.peer_tp_size;
  mc.model = m;
  mc.page_size = o.page_size;
  mc.aux_rows = aux_slots;
  // --memory engine: one buffer per layer tensor, allocated here (private memory, as an engine's
  // tensors are) and registered as engine buffers; kvferry keeps the aux rows. Freed after the
  // manager (declared first, destroyed last).
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<void, Free>> engine;
  if (o.memory == "engine") {
    const uint64_t bytes = pages * probe->page_bytes();
    for (uint32_t b = 0; b < probe->num_buffers(); ++b) {
      void* p = nullptr;
      if (posix_memalign(&p, 4096, bytes) != 0) return fail_start("out of memory for the engine buffers");
      engine.emplace_back(p);
      std::memset(p, 0, bytes);  // resident, as an engine's KV cache is
      BufferDesc d;
      d.address = reinterpret_cast<uint64_t>(p);
      d.bytes = bytes;
      d.item_bytes = probe->page_bytes();
      mc.buffers.push_back(d);
    }
  } else {
    mc.pool_bytes = pool_bytes;
  }
  mc.bootstrap_address = o.bootstrap;
  mc.transport = o.transport;
  mc.transfer_shards = o.transfer_shards;
  mc.integrity = o.integrity;
  mc.tcp_congestion = o.tcp_congestion == "default" ? "" : o.tcp_congestion;
  mc.deadlines.lookup_timeout_ms = static_cast<int64_t>(o.timeout_s * 1000);
  mc.progress_thread = false;
  auto manager = Manager::create(mc);
  if (!manager.ok()) return fail_start(manager.status().str());
  // Touch the whole pool once: KV pages are resident in serving; page faults are not transfer cost.
  if (engine.empty()) std::memset((*manager)->pool_base(), 0, (*manager)->layout().total_bytes());
  if (o.prefill) return run_prefill(o, **manager, *plan, name);
  return run_decode(o, **manager, name);
}

}  // namespace kvferry::bench
