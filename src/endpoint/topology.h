// Which prefill rank writes which heads to which decode rank, for any pair of TP sizes
// (docs/design.md §2 generalised to prefill TP != decode TP).
//
// GQA/MHA: every head a decode rank holds comes from exactly one prefill rank: the lowest-indexed
// prefill rank holding it (with replicated heads the other replicas write nothing, so no byte is
// written twice). Consecutive heads from the same prefill rank form one transfer.
// MLA: every rank holds the whole latent; decode rank d reads it from prefill rank d % prefill_tp,
// and the other prefill ranks conclude the room without writing.
// The aux record of a decode rank is written by its lowest source only.
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <vector>

#include "kvferry/error.h"
#include "kvferry/geometry.h"

namespace kvferry {

struct HeadTransfer {
  uint32_t prefill_rank = 0;
  uint32_t decode_rank = 0;
  uint32_t first_head = 0;  // global head index
  uint32_t num_heads = 0;
};

// Every transfer of one room, ordered by (decode_rank, first_head). Errors: a TP size the model's
// heads cannot be split over.
Result<std::vector<HeadTransfer>> plan_transfers(const ModelGeometry& m, uint32_t prefill_tp, uint32_t decode_tp);

// The decode ranks prefill rank `p` writes to / the prefill ranks decode rank `d` reads from (sorted).
std::vector<uint32_t> dests_of(const std::vector<HeadTransfer>& plan, uint32_t p);
std::vector<uint32_t> sources_of(const std::vector<HeadTransfer>& plan, uint32_t d);

}  // namespace kvferry
