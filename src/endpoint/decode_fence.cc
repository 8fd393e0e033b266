// DecodeEndpoint: the receiver-side room fence (kvferry/write_fence.h; docs/security.md "The room
// fence", docs/failure-model.md "Late writes"). The endpoint installs one fence into its
// transport. A room is opened at init() with the byte ranges its sources may write (every KV
// buffer's pages of the room, every aux buffer's row, the guard row, every state buffer's rows, in
// this rank's offset space) and closed once the room is terminal and every source it sent
// metadata to is terminal too (no honest write of it can come any more), or when it is released
// (also quarantined). Over tcp the transport then refuses every write naming a room that is not
// open, or touching bytes that are not the room's: a write failed at the prefill that arrives
// late, after the pages went to another room, lands nowhere. A placement still running when the
// fence closed (a rendezvous receive straight into the pages) keeps the room not drained, or its
// pages quarantined, until it is done.
#include <fmt/format.h>

#include <algorithm>

#include "endpoint/decode_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
}  // namespace

std::vector<FenceRange> DecodeEndpoint::fence_ranges(const ReceiverRoom& r) const {
  const MemoryShape& sh = core_.shape();
  // Runs of consecutive pages first (an allocator often hands out runs): one range per run and
  // buffer. Indices were checked against the shape by init().
  std::vector<uint64_t> pages = r.kv_indices;
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // first page, count
  for (uint64_t p : pages) {
    if (!runs.empty() && runs.back().first + runs.back().second == p) {
      ++runs.back().second;
    } else {
      runs.push_back({p, 1});
    }
  }
  std::vector<FenceRange> out;
  out.reserve(runs.size() * sh.kv_offsets.size() + sh.aux_offsets.size() + 1 +
              r.state_indices.size() * sh.state_offsets.size());
  for (size_t b = 0; b < sh.kv_offsets.size(); ++b)
    for (const auto& [first, count] : runs) out.push_back({sh.kv(b, first), count * sh.page_bytes});
  for (size_t a = 0; a < sh.aux_offsets.size(); ++a) out.push_back({sh.aux(a, r.aux_index), sh.aux_item_bytes[a]});
  out.push_back({sh.guard(r.aux_index), kAuxSlotBytes});
  for (size_t s = 0; s < sh.state_offsets.size(); ++s)
    for (uint64_t row : r.state_indices) out.push_back({sh.state(s, row), sh.state_item_bytes[s]});
  return out;
}

void DecodeEndpoint::open_fence(ReceiverRoom& r) {
  Status st = fence_->open(r.room, fence_ranges(r));
  if (st.ok()) {
    r.fence_open = true;
    return;
  }
  // Only a room id whose earlier placements still run (or a shape without bytes): its writes are
  // refused, so the room fails at its sources rather than taking bytes meant for the earlier one.
  log_event(LogLevel::kWarning, kComp, "room fence not opened: " + st.message(), {.room = r.room});
}

uint64_t DecodeEndpoint::close_fence(ReceiverRoom& r) {
  if (r.fence_open) {
    r.fence_open = false;
    return fence_->close(r.room);
  }
  return fence_->pinned(r.room);
}

void DecodeEndpoint::close_fence_if_drained(uint64_t room) {
  auto it = rooms_.find(room);
  if (it == rooms_.end() || !it->second.fence_open) return;
  ReceiverRoom& r = it->second;
  if (!r.state.terminal()) return;
  for (const RankId& src : r.metadata_sent)
    if (!r.terminal.count(src)) return;
  const uint64_t running = close_fence(r);
  log_event(LogLevel::kDebug, kComp,
            fmt::format("room fence closed: every source is terminal ({} placement(s) still running)", running),
            {.room = room});
}

bool DecodeEndpoint::fence_done(const ReceiverRoom& r) const {
  return !r.fence_open && fence_->pinned(r.room) == 0;
}

void DecodeEndpoint::tick_fences() {
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : rooms_)
    if (r.fence_open && r.state.terminal()) ids.push_back(id);
  for (uint64_t id : ids) close_fence_if_drained(id);
  std::vector<uint64_t> done;
  for (auto& [id, q] : quarantined_) {
    if (!q.placements || fence_->pinned(id) != 0) continue;
    q.placements = false;
    if (q.pending.empty()) done.push_back(id);
  }
  for (uint64_t id : done) end_quarantine(id, "its last placement is done");
}

}  // namespace kvferry
