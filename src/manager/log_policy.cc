#include "manager/log_policy.h"

#include <fmt/format.h>

namespace kvferry {

LogLevel failure_log_level(Role role, bool is_from_another_rank, ErrorCode code) {
  if (is_from_another_rank) return LogLevel::kDebug;
  if (code == ErrorCode::kAborted) return LogLevel::kInfo;
  if (code == ErrorCode::kResourceExhausted) return LogLevel::kWarning;
  return role == Role::kDecode ? LogLevel::kError : LogLevel::kWarning;
}

FailureLine failure_release_line(Role role, uint64_t room, const Failure& root, const std::optional<Failure>& own) {
  FailureLine out;
  const bool local = own && own->origin == root.origin && own->code == root.code &&
                     own->first_seen_ns == root.first_seen_ns;
  out.is_from_another_rank = !local;
  out.level = failure_log_level(role, !local, root.code);
  out.msg = fmt::format("room {} failed: {}", room, root.describe());
  out.fields = failure_log_fields(room, root);
  out.fields.extra.push_back({"is_from_another_rank", local ? "false" : "true"});
  if (own && !local) {
    out.msg += fmt::format(" (own failure {} superseded by {})", own->describe(), root.origin.str());
    out.fields.extra.push_back({"superseded_by", root.origin.str()});
    out.fields.extra.push_back({"superseded_code", std::string(code_name(own->code))});
    out.fields.extra.push_back({"superseded_reason", own->reason});
  }
  return out;
}

}  // namespace kvferry
