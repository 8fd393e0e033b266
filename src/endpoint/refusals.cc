#include "endpoint/refusals.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvferry {

std::string_view refusal_name(Refusal kind) {
  switch (kind) {
    case Refusal::kOutsidePlan: return "outside_plan";
    case Refusal::kTooManyPeers: return "too_many_peers";
    case Refusal::kMalformed: return "malformed";
    case Refusal::kBadRegistration: return "bad_registration";
    case Refusal::kChangedRegistration: return "changed_registration";
    case Refusal::kUnconfirmedRestart: return "unconfirmed_restart";
    case Refusal::kFutureIncarnation: return "future_incarnation";
    case Refusal::kIncompatible: return "incompatible";
    case Refusal::kCount: break;
  }
  return "unknown";
}

void RefusalLog::refuse(Refusal kind, const std::string& what, LogFields fields, int64_t now_ns, bool quiet) {
  const size_t k = static_cast<size_t>(kind);
  ++counts_[k];
  if (!quiet) ++since_line_[k];
  fields.extra.push_back({"event", "refused"});
  fields.extra.push_back({"refusal", std::string(refusal_name(kind))});
  if (fields.code.empty()) fields.code = std::string(code_name(ErrorCode::kProtocolError));
  if (quiet || (logged_[k] && now_ns - line_ns_[k] < kLineIntervalNs)) {
    if (debug_lines_[k] == 0 || now_ns - debug_window_ns_[k] >= kLineIntervalNs) {
      debug_window_ns_[k] = now_ns;
      debug_lines_[k] = 0;
    }
    if (debug_lines_[k]++ < kDebugLinesPerInterval) log_event(LogLevel::kDebug, component_, what, fields);
    return;
  }
  const uint64_t n = since_line_[k];
  logged_[k] = true;
  line_ns_[k] = now_ns;
  since_line_[k] = 0;
  log_event(LogLevel::kWarning, component_,
            n > 1 ? fmt::format("{} ({} {} refusals since the last such line)", what, n, refusal_name(kind)) : what,
            fields);
}

bool RateLimit::take(int64_t now_ns) {
  if (last_ns_ != 0 && now_ns > last_ns_) tokens_ = std::min(burst_, tokens_ + rate_ * double(now_ns - last_ns_) * 1e-9);
  last_ns_ = now_ns;
  if (tokens_ >= 1.0) {
    tokens_ -= 1.0;
    return true;
  }
  ++denied_;
  return false;
}

}  // namespace kvferry
