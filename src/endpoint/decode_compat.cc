// DecodeEndpoint's pool registration and the compatibility check of its sources' bootstrap
// entries (kvferry/compat.h; decode_endpoint.h).
#include <fmt/format.h>

#include <algorithm>

#include "endpoint/decode_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
}  // namespace

PoolRegistration DecodeEndpoint::make_registration(uint64_t peer_incarnation) const {
  const PoolLayout& l = core_.layout();
  const MemoryShape& sh = core_.shape();
  PoolRegistration reg;
  reg.sender = core_.self();
  reg.compat = core_.compat();
  reg.incarnation = core_.incarnation();
  reg.peer_incarnation = peer_incarnation;
  reg.control_endpoint = core_.control_endpoint();
  reg.worker_address = core_.transport().address();
  reg.spans = core_.spans();
  reg.page_size = sh.page_size;
  reg.page_bytes = sh.page_bytes;
  reg.num_pages = sh.num_pages;
  reg.kv_offsets = sh.kv_offsets;
  reg.aux_offsets = sh.aux_offsets;
  reg.aux_item_bytes = sh.aux_item_bytes;
  reg.aux_rows = sh.aux_rows;
  reg.state_offsets = sh.state_offsets;
  reg.state_item_bytes = sh.state_item_bytes;
  reg.state_rows = sh.state_rows;
  reg.guard_offset = sh.guard_offset;
  reg.heads_per_rank = l.heads_per_rank;
  reg.first_head = l.first_head;
  return reg;
}

Status DecodeEndpoint::check_source_compat(const RankId& source, const PrefillRankInfo& info) {
  std::optional<CompatMismatch> mm = compat_mismatch(core_.compat(), info.compat);
  if (!mm) return Status::Ok();
  const std::string why =
      fmt::format("prefill peer {} is incompatible with {}: {}", source.str(), core_.self().str(), mm->str());
  bool new_incarnation = false;
  if (core_.first_incompatible(source, info.incarnation, monotonic_ns(), &new_incarnation))
    log_event(LogLevel::kError, kComp,
              why + " (ours, then the peer's); the rooms it would feed fail with incompatible_peer",
              {.code = std::string(code_name(ErrorCode::kIncompatiblePeer)), .origin = core_.self().str(),
               .extra = {{"peer", source.str()}, {"event", "incompatible_peer"}, {"field", mm->field}}});
  if (new_incarnation) {
    // Tell the prefill rank too, once per incarnation: it reads our fingerprint first, refuses the
    // registration and logs its own line (prefill_registration.cc admits_compat). The peer is not
    // made ours: no connection, no heartbeats, its answer is not needed.
    Status s = core_.send(info.control_endpoint, make_registration(info.incarnation));
    if (!s.ok()) log_event(LogLevel::kDebug, kComp, fmt::format("registration to {} not sent: {}", source.str(), s.str()));
  }
  return {ErrorCode::kIncompatiblePeer, why};
}

bool DecodeEndpoint::admit_rediscovered(const RankId& source, const PrefillRankInfo& info) {
  Status s = check_source_compat(source, info);
  if (s.ok()) return true;
  const int64_t now = monotonic_ns();
  const Failure f{ErrorCode::kIncompatiblePeer, core_.self(), s.message(), now, wall_from_monotonic(now)};
  refused_[source] = f;
  std::vector<uint64_t> fed;
  for (auto& [id, r] : rooms_) {
    if (r.state.terminal()) continue;
    if (std::find(r.sources.begin(), r.sources.end(), source) != r.sources.end()) fed.push_back(id);
  }
  for (uint64_t id : fed) fail(id, f, /*observed_here=*/false, &source);
  return false;
}

}  // namespace kvferry
