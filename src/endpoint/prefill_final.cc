// PrefillEndpoint: a room's final batch (this rank's aux rows, state rows and the guard row) and
// its Success (prefill_endpoint.h; docs/manager.md "Per-chunk completion").
//
// The final batch rides behind the last chunk's KV writes, in the same transport batch to each
// destination, when that chunk carries pages (stage_final). A 1-page room then costs one write
// round and one status frame instead of two write rounds: over tcp a batch completes on the
// receiver's acknowledgement, so the separate batch was a second round trip plus two wake-ups of
// the progress thread (docs/BENCHMARKS.md "One-page rooms"). Decode reads the guard row only once
// every source said Success, and a source says Success only once every write of the room, KV and
// final, completed, so no order between the rows and the KV inside or across batches is needed.
// A last chunk of zero pages, or a guard row that cannot be staged yet, takes the separate
// batch once every KV write completed (maybe_finish).
#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "endpoint/integrity.h"
#include "endpoint/prefill_endpoint.h"
#include "kvferry/content.h"
#include "kvferry/log.h"
#include "kvferry/routing.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.endpoint";
}  // namespace

std::string PrefillEndpoint::final_ops(const SenderRoom& r, const RankId& d, uint64_t guard,
                                       std::vector<WriteOp>& ops) const {
  const MemoryShape& ours = core_.shape();
  const MemoryShape& theirs = peers_.at(d).shape;
  const RoomMetadata& md = r.meta.at(d);
  if (md.state_indices.size() != r.state_indices.size())
    return fmt::format("{} state indices here, {} gave {}", r.state_indices.size(), d.str(), md.state_indices.size());
  if (r.aux_index) {
    for (size_t a = 0; a < ours.aux_offsets.size(); ++a)
      ops.push_back({ours.aux(a, *r.aux_index), theirs.aux(a, md.aux_index), ours.aux_item_bytes[a]});
  }
  for (size_t s = 0; s < ours.state_offsets.size(); ++s)
    for (size_t j = 0; j < r.state_indices.size(); ++j)
      ops.push_back({ours.state(s, r.state_indices[j]), theirs.state(s, md.state_indices[j]), ours.state_item_bytes[s]});
  ops.push_back({ours.guard(guard), theirs.guard(md.aux_index), sizeof(AuxRecord)});  // last
  return "";
}

PrefillEndpoint::FinalStage PrefillEndpoint::build_final(SenderRoom& r, FinalBatches& out) {
  uint64_t guard = 0;
  if (r.aux_index) {
    guard = *r.aux_index;
  } else {
    auto slot = aux_alloc_.alloc(1);
    if (!slot) return FinalStage::kNotYet;  // retried from tick()
    r.aux_staging = (*slot)[0];
    guard = *r.aux_staging;
  }
  r.aux_submitted = true;
  r.progress_ns = monotonic_ns();
  AuxRecord rec = make_aux(r.room, r.input_tokens, r.total_pages);
  std::memcpy(core_.guard_row(guard), &rec, sizeof rec);
  // Every batch is built before any is written: a mismatch fails the room with nothing sent.
  for (const RankId& d : r.dests) {
    auto srcs = sources_of(plan_, d.tp_rank);
    if (srcs.empty() || srcs.front() != core_.self().tp_rank) continue;  // its lowest source writes aux
    std::vector<WriteOp> ops;
    std::string bad = final_ops(r, d, guard, ops);
    if (!bad.empty()) {
      fail(r.room, ErrorCode::kProtocolError, "state rows do not match: " + bad, core_.self(), monotonic_ns(), true);
      return FinalStage::kFailed;
    }
    if (r.meta.at(d).integrity) r.digests[d] += ops_digest(core_.map(), ops, 0);  // one piece per row
    out.push_back({d, std::move(ops)});
  }
  return FinalStage::kBuilt;
}

PrefillEndpoint::FinalStage PrefillEndpoint::stage_final(SenderRoom& r, FinalBatches& out) {
  FinalStage st = build_final(r, out);
  if (st == FinalStage::kBuilt) r.final_in_chunk = true;
  return st;
}

void PrefillEndpoint::maybe_finish(SenderRoom& r) {
  if (r.state.get() != KVPoll::Transferring || r.aux_submitted || r.inflight != 0 || !r.last_received ||
      r.units_done != r.total_pages * r.layer_pages.size())
    return;
  if (r.dests.empty()) return conclude_room(r);
  FinalBatches batches;
  if (build_final(r, batches) != FinalStage::kBuilt) return;
  for (auto& [d, ops] : batches) {
    uint64_t bytes = 0;
    for (const WriteOp& op : ops) bytes += op.length;
    uint64_t tag = next_aux_tag_++;
    aux_tags_[tag] = r.room;
    ++r.inflight;
    EndpointCore* core = &core_;
    uint64_t room = r.room;
    PeerId pid = peers_.at(d).peer;
    core_.transport().write(pid, room, std::move(ops), [core, room, tag, pid, bytes](Status st) {
      core->post({room, tag, std::move(st), bytes, pid});
    });
  }
  if (batches.empty()) {  // another rank writes this destination's aux record: we are done
    send_status(r, KVPoll::Success);
    r.state.advance(KVPoll::Success);
  }
}

void PrefillEndpoint::maybe_succeed(SenderRoom& r) {
  if (!r.final_in_chunk || r.state.get() != KVPoll::Transferring || r.inflight != 0 ||
      r.units_done != r.total_pages * r.layer_pages.size())
    return;
  send_status(r, KVPoll::Success);
  r.state.advance(KVPoll::Success);
  log_event(LogLevel::kDebug, kComp, "transfer complete", {.room = r.room});
}

void PrefillEndpoint::free_staging_row(SenderRoom& r) {
  if (!r.aux_staging || !r.aux_submitted || r.inflight != 0) return;
  aux_alloc_.free({*r.aux_staging});
  r.aux_staging.reset();
}

}  // namespace kvferry
