// What a rank refuses from its peers, counted by kind and logged without flooding
// (docs/security.md, "Refusals"; every count is on /metrics as kvferry_refused_frames_total).
//
// A peer may send as many bad frames as it likes: each refusal is counted, but a kind is logged
// as a warning at most once per RefusalLog::kLineIntervalNs, that line naming how many of the kind
// were refused since the previous one; the others go to debug. RateLimit bounds what a rank does
// in answer to refused frames (a RegistrationRefusal sent back).
// Thread contract: the rank's main thread (EndpointCore's owner).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvferry/error.h"
#include "kvferry/log.h"

namespace kvferry {

enum class Refusal : uint8_t {
  kOutsidePlan = 0,     // the sender is no source/destination of this rank in the transfer plan
  kTooManyPeers,        // a new identity beyond the per-identity cap
  kMalformed,           // the codec refused the frame (kvferry/messages.h)
  kBadRegistration,     // a pool registration this rank cannot use (check_registration, transport)
  kChangedRegistration, // a different pool under an incarnation that registered another one
  kUnconfirmedRestart,  // a newer incarnation not from a registration, or its old one still answers
  kFutureIncarnation,   // an incarnation beyond this rank's clock plus the allowed skew
  kIncompatible,        // a pool registration whose compatibility fingerprint differs (kvferry/compat.h)
  kCount
};
constexpr size_t kRefusalKinds = static_cast<size_t>(Refusal::kCount);
// "outside_plan", "too_many_peers", ... (the metric's kind label).
std::string_view refusal_name(Refusal kind);

class RefusalLog {
 public:
  static constexpr int64_t kLineIntervalNs = 10'000'000'000;  // one warning per kind per 10 s
  // Debug lines per kind per kLineIntervalNs (the rest are counted only: the next warning names
  // them), so a peer sending bad frames cannot fill a log file at debug level either.
  static constexpr uint64_t kDebugLinesPerInterval = 20;

  explicit RefusalLog(std::string component) : component_(std::move(component)) {}
  // Counts one refusal and logs `what`: a warning (with the count since the previous warning of
  // this kind) when the kind's last warning is kLineIntervalNs old, else debug (at most
  // kDebugLinesPerInterval a kind per interval).
  // `quiet`: counted, logged at debug only (e.g. a restart claim held until it is confirmed: a
  // genuine restart on the same port looks like that for a moment).
  void refuse(Refusal kind, const std::string& what, LogFields fields, int64_t now_ns, bool quiet = false);
  uint64_t count(Refusal kind) const { return counts_[static_cast<size_t>(kind)]; }
  const std::array<uint64_t, kRefusalKinds>& counts() const { return counts_; }

 private:
  std::string component_;
  std::array<uint64_t, kRefusalKinds> counts_{};
  std::array<uint64_t, kRefusalKinds> since_line_{};
  std::array<int64_t, kRefusalKinds> line_ns_{};
  std::array<bool, kRefusalKinds> logged_{};
  std::array<int64_t, kRefusalKinds> debug_window_ns_{};
  std::array<uint64_t, kRefusalKinds> debug_lines_{};
};

// A token bucket: at most `burst` at once, refilled at `per_second`.
class RateLimit {
 public:
  RateLimit(double per_second, double burst) : rate_(per_second), burst_(burst), tokens_(burst) {}
  bool take(int64_t now_ns);
  uint64_t denied() const { return denied_; }

 private:
  double rate_, burst_, tokens_;
  int64_t last_ns_ = 0;
  uint64_t denied_ = 0;
};

}  // namespace kvferry
