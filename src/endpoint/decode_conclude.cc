// DecodeEndpoint: a room whose every source said Success is concluded here: its integrity, when
// this rank asked for it (ManagerConfig::integrity, endpoint/integrity.h), then its guard row.
//
// Integrity is checked first, so a byte flipped in flight in the guard row is named for what it
// is (integrity_error), not as a guard mismatch. The digests are computed on the thread that runs
// the endpoint (the progress thread, or the engine's poll), over this rank's own plan for each
// source: the room's pages, and the lowest source's aux, state and guard rows; never over regions
// a source claims. That thread is busy meanwhile (0.05-0.15 s per GiB on this machine; its cost in
// throughput: docs/integrity.md "Cost"): other rooms' frames and completions wait for it.
#include <fmt/format.h>

#include <cstring>

#include "endpoint/decode_endpoint.h"
#include "endpoint/integrity.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
}

std::string DecodeEndpoint::check_integrity(const ReceiverRoom& r) const {
  const auto lowest = sources_of(plan_, core_.self().tp_rank);
  for (const RankId& src : r.sources) {
    auto it = r.digests.find(src);
    if (it == r.digests.end() || !it->second)
      return fmt::format("{} reported Success without the integrity digest this room asked for", src.str());
    SourceRegions regions{src.tp_rank, r.kv_indices, !lowest.empty() && lowest.front() == src.tp_rank,
                          r.aux_index, r.state_indices};
    const uint64_t landed = landed_digest(core_.map(), core_.layout(), plan_, core_.self().tp_rank, regions);
    if (landed != *it->second)
      return fmt::format("the bytes {} wrote do not match its digest ({:016x} landed, {:016x} sent; {} pages)",
                         src.str(), landed, *it->second, r.kv_indices.size());
  }
  return "";
}

void DecodeEndpoint::conclude(ReceiverRoom& r) {
  std::string bad;
  ErrorCode code = ErrorCode::kIntegrityError;
  if (core_.config().integrity) bad = check_integrity(r);
  if (bad.empty()) {
    AuxRecord rec;
    std::memcpy(&rec, core_.guard_row(r.aux_index), sizeof rec);
    if (rec.room != r.room || rec.cached_tokens != r.input_tokens || rec.num_pages != r.total_pages) {
      code = ErrorCode::kProtocolError;
      bad = fmt::format("aux guard mismatch in row {}: holds room {} ({} tokens, {} pages), expected room {} ({} "
                        "tokens, {} pages)", r.aux_index, rec.room, rec.cached_tokens, rec.num_pages, r.room,
                        r.input_tokens, r.total_pages);
    }
  }
  if (!bad.empty()) {
    fail(r.room, code, bad, core_.self(), monotonic_ns(), true);
    // Every source said Success, so fail() told none of them: they are told now (their rooms
    // concluded; a sender still held then polls Failed with this cause, as for its engine's).
    if (auto e = core_.registry().get(r.room))
      send_to_sources(r, RoomStatus{r.room, core_.self(), KVPoll::Failed, e->failure(), true}, /*succeeded=*/true);
    return;
  }
  r.success_ns = monotonic_ns();
  r.state.advance(KVPoll::Success);
  log_event(LogLevel::kDebug, kComp, "all sources reported success", {.room = r.room});
}

}  // namespace kvferry
