// The one error vocabulary of kvferry: ErrorCode, RankId, Status, Result<T>, KVTransferError.
//
// Codes are chosen by what the caller does next (docs/design.md §3, "Sources"). Not-ready is a state
// (KVPoll), never an error. Exceptions are used only at the edges (CLI, Python).
// Thread contract: value types; no shared state.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace kvferry {

// Wire values are stable: they travel in control messages and reports.
enum class ErrorCode : uint16_t {
  kOk = 0,
  kTransferError = 1,      // the transport failed a write or flush
  kPeerUnreachable = 2,    // transport error handler, connection loss, missed heartbeats
  kBootstrapTimeout = 3,   // prefill: the room's metadata never came
  kWaitingTimeout = 4,     // decode: the data never came
  kPreallocTimeout = 5,    // decode: pages never became free
  kAborted = 6,            // abort by the client or router
  kProtocolError = 7,      // malformed/inconsistent message, aux guard mismatch, bad page index
  kResourceExhausted = 8,  // a request that can never fit the pools, or out of memory
  kInjected = 9,           // fault injected by a test or replay
  kInvalidArgument = 10,   // a local caller passed something wrong (bad trace line, bad option)
  kInternal = 11,          // a bug or an unexpected system error
  kIncompatiblePeer = 12,  // the peer's compatibility fingerprint differs (kvferry/compat.h)
  kIntegrityError = 13,    // decode: the bytes that landed do not match the source's digest
};
constexpr int kMaxErrorCode = 13;

// snake_case names used in logs and reports: "transfer_error", "peer_unreachable", ...
std::string_view code_name(ErrorCode c);
std::optional<ErrorCode> code_from_name(std::string_view s);
std::optional<ErrorCode> code_from_int(int v);

enum class Role : uint8_t { kPrefill = 0, kDecode = 1 };
std::string_view role_name(Role r);  // "prefill" / "decode"

// One rank of one engine. Printed as "prefill/tp1" (dp_rank appended as "/dp1" when non-zero,
// engine_id as "prefill1/tp0" when non-zero).
struct RankId {
  Role role = Role::kPrefill;
  uint32_t engine_id = 0;
  uint32_t tp_rank = 0;
  uint32_t dp_rank = 0;

  std::string str() const;
  static std::optional<RankId> parse(std::string_view s);
  friend bool operator==(const RankId&, const RankId&) = default;
  friend auto operator<=>(const RankId&, const RankId&) = default;
};

// Success, or a code with a message. Cheap to copy when ok.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }
  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string str() const;  // "ok" or "<code_name>: <message>"

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// A value or a non-ok Status (abseil's StatusOr in spirit).
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {}          // NOLINT(implicit); must be !ok()
  Result(ErrorCode c, std::string m) : v_(Status(c, std::move(m))) {}
  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

// One failure of a room as a fact: what failed, where it was first observed as a local fact, why,
// and when. The one record embedded in every message and report that carries a failure (the
// control plane's RoomStatus, the engine agreement, the engine's result, log lines); encoded by one
// binary piece (src/control/codec.cc) and one JSON codec (src/core/failure_json.h). See
// docs/failure-model.md.
struct Failure {
  ErrorCode code = ErrorCode::kInternal;
  RankId origin;
  std::string reason;
  // CLOCK_MONOTONIC ns on the origin's host when the origin observed it: durations on that host.
  int64_t first_seen_ns = 0;
  // CLOCK_REALTIME ns at the same instant, on the origin's clock: the root-cause rule's clock (the
  // only one comparable across hosts, within their skew). 0: not known (then the rule compares
  // first_seen_ns). Stamped by the origin's FailureRegistry when it records the failure.
  int64_t wall_ns = 0;

  // "transfer_error at prefill/tp1: <reason>"
  std::string describe() const;
  friend bool operator==(const Failure&, const Failure&) = default;
};

// The root-cause rule (docs/failure-model.md, "Root cause"): when several ranks observe a local
// failure of the same room, the one that precedes all others in this strict total order is the
// room's root cause, on every rank of both engines. The order compares, in turn:
//   1. the time bucket: wall_ns / kFailureSkewWindowNs (first_seen_ns when either wall_ns is 0),
//      earlier first; failures closer than the clocks' skew are not ordered by time but by:
//   2. the kind: a cause (transfer, peer, protocol, injected, abort, ...) before a timeout
//      (bootstrap, waiting, prealloc), which is usually the consequence of another rank's trouble;
//   3. the origin in a fixed rank order: prefill before decode, then engine_id, dp_rank, tp_rank;
//   4. then code, exact time, reason, so that distinct records are never equivalent.
// The winner of a set is therefore a function of the set, never of the order records arrived in,
// and the winner of a union is the winner of the subsets' winners (an engine's MIN over ranks).
constexpr int64_t kFailureSkewWindowNs = 5'000'000;  // 5 ms
bool failure_precedes(const Failure& a, const Failure& b);
// The root cause of `failures` (nullptr when empty); a pointer into the vector.
const Failure* root_cause(const std::vector<Failure>& failures);

// The error of a failed room as one rank sees it: the room's root cause (Failure) and whether it
// was propagated to this rank. `origin` is the rank where the failure was first observed as a local
// fact; `is_from_another_rank` is true exactly when the failure was propagated to this rank (it
// reached this rank in a message, even one naming this rank, e.g. a restarted rank blamed for its
// previous incarnation's death). `superseded`: the other ranks' (or this rank's own) local failures
// of the room known here that lost to this one by the root-cause rule (secondary detail, at most 4).
struct KVTransferError {
  uint64_t bootstrap_room = 0;
  ErrorCode code = ErrorCode::kInternal;
  std::string failure_reason;
  RankId origin;
  bool is_from_another_rank = false;
  int64_t first_seen_ns = 0;  // CLOCK_MONOTONIC ns when the origin observed it (origin's host)
  int64_t wall_ns = 0;        // CLOCK_REALTIME ns, same instant (Failure::wall_ns)
  std::vector<Failure> superseded;

  static KVTransferError from(uint64_t room, const Failure& f, bool is_from_another_rank);
  Failure failure() const;
  // "room 123: transfer_error at prefill/tp1 (from another rank): <reason>"
  std::string str() const;
};

// CLOCK_MONOTONIC in ns; comparable across processes of one machine.
int64_t monotonic_ns();
// CLOCK_REALTIME in ns (wall clock); comparable across hosts within their clock skew.
int64_t realtime_ns();
// The wall-clock instant of `mono_ns`, a CLOCK_MONOTONIC stamp taken on this host.
int64_t wall_from_monotonic(int64_t mono_ns);

}  // namespace kvferry
