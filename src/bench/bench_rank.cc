// One `kvferry bench-rank` process (bench.h describes the protocol). The rank is a caller-pumped
// Manager (kvferry/manager.h) driven only through the public Sender/Receiver (bench_loops.cc).
#include <algorithm>
#include <cstring>

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
  mc.pool_bytes = pool_bytes;
  mc.aux_rows = aux_slots;
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
  std::memset((*manager)->pool_base(), 0, (*manager)->layout().total_bytes());
  if (o.prefill) return run_prefill(o, **manager, *plan, name);
  return run_decode(o, **manager, name);
}

}  // namespace kvferry::bench
