// Deterministic KV content for replay and tests: every byte of a page is derived from
// (room, layer, tensor, token position, global head, element), so decode can verify every byte at
// its exact destination without any side channel. A head landing on the wrong rank, layer, tensor
// or page, or a stale write from another room, shows up as a mismatch.
// Thread contract: pure functions.
#pragma once
#include <cstdint>

#include "kvferry/geometry.h"

namespace kvferry {

// Fills one page of buffer `buffer` of this rank's layout at `dst` (page_bytes() bytes) with the
// content of tokens [first_token, first_token + page_size) of `room`.
void fill_page(const PoolLayout& layout, uint64_t room, uint32_t buffer, uint64_t first_token,
               uint8_t* dst);

// Checks one page as fill_page would have written it; returns the number of mismatched bytes
// (0 when the page is exactly right).
uint64_t verify_page(const PoolLayout& layout, uint64_t room, uint32_t buffer, uint64_t first_token,
                     const uint8_t* src);

// The aux record prefill writes for a room of `input_tokens` tokens.
AuxRecord make_aux(uint64_t room, uint64_t input_tokens, uint64_t num_pages);

}  // namespace kvferry
