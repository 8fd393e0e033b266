// The one error vocabulary of kvferry: ErrorCode, RankId, Status, Result<T>, KVTransferError.
//
// Codes are chosen by what the caller does next (DESIGN.md §3, "Sources"). Not-ready is a state
// (KVPoll), never an error. Exceptions are used only at the edges (CLI, Python).
// Thread contract: value types; no shared state.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

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
};
constexpr int kMaxErrorCode = 11;

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

// The error of a failed room as one rank sees it. `origin` is the rank where the failure was first
// observed as a local fact; `dead_peer` is set for peer death (then origin == dead peer's
// detector's view of it, see DESIGN §3). `is_from_another_rank` is true exactly when the failure
// was propagated to this rank (origin != this rank).
struct KVTransferError {
  uint64_t bootstrap_room = 0;
  ErrorCode code = ErrorCode::kInternal;
  std::string failure_reason;
  RankId origin;
  bool is_from_another_rank = false;
  int64_t first_seen_ns = 0;  // CLOCK_MONOTONIC ns when the origin observed it

  // "room 123: transfer_error at prefill/tp1 (from another rank): <reason>"
  std::string str() const;
};

// CLOCK_MONOTONIC in ns; comparable across processes of one machine.
int64_t monotonic_ns();

}  // namespace kvferry
