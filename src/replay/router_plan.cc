// The router's deterministic request plan (router.h plan_requests()).
#include <algorithm>
#include <random>
#include <unordered_set>

#include "kvferry/routing.h"
#include "replay/router.h"

namespace kvferry::replay {

std::vector<RouterRequest> plan_requests(const std::vector<TraceRequest>& trace, uint64_t seed,
                                         const FaultPlan& faults, uint32_t prefill_tp,
                                         uint32_t decode_tp, uint32_t prefill_dp,
                                         uint32_t decode_dp) {
  std::vector<TraceRequest> sorted = trace;
  std::stable_sort(sorted.begin(), sorted.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.arrival_ms < b.arrival_ms;
  });
  std::mt19937_64 rng(seed);
  std::unordered_set<uint64_t> used;
  std::vector<RouterRequest> plan;
  plan.reserve(sorted.size());
  auto assigned = assign_room_faults(faults, sorted.size(), seed, prefill_tp, decode_tp);
  for (size_t i = 0; i < sorted.size(); ++i) {
    RouterRequest q;
    do {
      q.room = rng() >> 1;  // 63 bits
    } while (q.room == 0 || !used.insert(q.room).second);
    q.input_tokens = sorted[i].input_tokens;
    q.output_tokens = sorted[i].output_tokens;
    q.arrival_ms = sorted[i].arrival_ms;
    q.fault = std::move(assigned[i]);
    if (q.fault) {  // the rank of the group serving the room
      RankId& at = q.fault->at;
      at.dp_rank = dp_rank_for_room(q.room, at.role == Role::kPrefill ? prefill_dp : decode_dp);
    }
    plan.push_back(std::move(q));
  }
  return plan;
}

}  // namespace kvferry::replay
