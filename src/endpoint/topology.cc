#include "endpoint/topology.h"

#include <algorithm>
#include <set>

namespace kvferry {

Result<std::vector<HeadTransfer>> plan_transfers(const ModelGeometry& m, uint32_t prefill_tp, uint32_t decode_tp) {
  std::vector<HeadTransfer> out;
  if (m.is_mla()) {
    if (prefill_tp == 0 || decode_tp == 0) return Status(ErrorCode::kInvalidArgument, "TP size 0");
    for (uint32_t d = 0; d < decode_tp; ++d) out.push_back({d % prefill_tp, d, 0, 1});
    return out;
  }
  std::vector<HeadSlice> prefill(prefill_tp);
  for (uint32_t p = 0; p < prefill_tp; ++p) {
    auto s = head_slice(m, prefill_tp, p);
    if (!s.ok()) return s.status();
    prefill[p] = *s;
  }
  for (uint32_t d = 0; d < decode_tp; ++d) {
    auto s = head_slice(m, decode_tp, d);
    if (!s.ok()) return s.status();
    for (uint32_t h = s->first; h < s->first + s->count; ++h) {
      uint32_t src = prefill_tp;
      for (uint32_t p = 0; p < prefill_tp && src == prefill_tp; ++p)
        if (h >= prefill[p].first && h < prefill[p].first + prefill[p].count) src = p;
      if (src == prefill_tp) return Status(ErrorCode::kInternal, "no prefill rank holds head " + std::to_string(h));
      if (!out.empty() && out.back().decode_rank == d && out.back().prefill_rank == src &&
          out.back().first_head + out.back().num_heads == h) {
        ++out.back().num_heads;
      } else {
        out.push_back({src, d, h, 1});
      }
    }
  }
  return out;
}

std::vector<uint32_t> dests_of(const std::vector<HeadTransfer>& plan, uint32_t p) {
  std::set<uint32_t> s;
  for (const HeadTransfer& t : plan)
    if (t.prefill_rank == p) s.insert(t.decode_rank);
  return {s.begin(), s.end()};
}

std::vector<uint32_t> sources_of(const std::vector<HeadTransfer>& plan, uint32_t d) {
  std::set<uint32_t> s;
  for (const HeadTransfer& t : plan)
    if (t.decode_rank == d) s.insert(t.prefill_rank);
  return {s.begin(), s.end()};
}

}  // namespace kvferry
