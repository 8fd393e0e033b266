// The failure record (Failure, KVTransferError) and the root-cause rule (kvferry/error.h,
// docs/failure-model.md).
#include <tuple>

#include "kvferry/error.h"

namespace kvferry {
namespace {

// Timeouts are usually the consequence of trouble elsewhere: within one skew window, a cause wins.
int kind_order(ErrorCode c) {
  switch (c) {
    case ErrorCode::kBootstrapTimeout:
    case ErrorCode::kWaitingTimeout:
    case ErrorCode::kPreallocTimeout:
      return 1;
    default:
      return 0;
  }
}

// Floor division, so that negative stamps (never expected) still bucket consistently.
int64_t bucket(int64_t t) {
  int64_t q = t / kFailureSkewWindowNs;
  if (t % kFailureSkewWindowNs < 0) --q;
  return q;
}

}  // namespace

std::string Failure::describe() const {
  std::string s(code_name(code));
  s += " at ";
  s += origin.str();
  s += ": ";
  s += reason;
  return s;
}

bool failure_precedes(const Failure& a, const Failure& b) {
  const bool wall = a.wall_ns != 0 && b.wall_ns != 0;
  const int64_t ta = wall ? a.wall_ns : a.first_seen_ns;
  const int64_t tb = wall ? b.wall_ns : b.first_seen_ns;
  auto key = [](const Failure& f, int64_t t) {
    return std::make_tuple(bucket(t), kind_order(f.code), static_cast<int>(f.origin.role), f.origin.engine_id,
                           f.origin.dp_rank, f.origin.tp_rank, static_cast<int>(f.code), t);
  };
  const auto ka = key(a, ta), kb = key(b, tb);
  if (ka != kb) return ka < kb;
  return a.reason < b.reason;
}

const Failure* root_cause(const std::vector<Failure>& failures) {
  const Failure* best = nullptr;
  for (const Failure& f : failures)
    if (!best || failure_precedes(f, *best)) best = &f;
  return best;
}

KVTransferError KVTransferError::from(uint64_t room, const Failure& f, bool is_from_another_rank) {
  KVTransferError e;
  e.bootstrap_room = room;
  e.code = f.code;
  e.failure_reason = f.reason;
  e.origin = f.origin;
  e.is_from_another_rank = is_from_another_rank;
  e.first_seen_ns = f.first_seen_ns;
  e.wall_ns = f.wall_ns;
  return e;
}

Failure KVTransferError::failure() const { return {code, origin, failure_reason, first_seen_ns, wall_ns}; }

std::string KVTransferError::str() const {
  std::string s = "room " + std::to_string(bootstrap_room) + ": ";
  s += code_name(code);
  s += " at ";
  s += origin.str();
  if (is_from_another_rank) s += " (from another rank)";
  s += ": ";
  s += failure_reason;
  return s;
}

}  // namespace kvferry
