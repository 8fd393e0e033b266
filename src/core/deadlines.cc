#include "kvferry/deadlines.h"

#include <cstdlib>
#include <string>

namespace kvferry {

const std::vector<DeadlineField>& deadline_fields() {
  static const std::vector<DeadlineField> fields = {
      {"--bootstrap-timeout-ms", "KVFERRY_BOOTSTRAP_TIMEOUT_MS", &Deadlines::bootstrap_timeout_ms,
       "prefill: fail a room whose metadata has not come within this"},
      {"--waiting-timeout-ms", "KVFERRY_WAITING_TIMEOUT_MS", &Deadlines::waiting_timeout_ms,
       "decode: fail a room whose data has not come within this after its metadata went out"},
      {"--prealloc-timeout-ms", "KVFERRY_PREALLOC_TIMEOUT_MS", &Deadlines::prealloc_timeout_ms,
       "decode: fail a room that waited this long for free pages"},
      {"--heartbeat-interval-ms", "KVFERRY_HEARTBEAT_INTERVAL_MS", &Deadlines::heartbeat_interval_ms,
       "period of heartbeats between peer ranks"},
      {"--heartbeat-timeout-ms", "KVFERRY_HEARTBEAT_TIMEOUT_MS", &Deadlines::heartbeat_timeout_ms,
       "a peer rank silent this long is dead"},
      {"--drain-timeout-ms", "KVFERRY_DRAIN_TIMEOUT_MS", &Deadlines::drain_timeout_ms,
       "decode: quarantine a failed room's pages if prefill has not confirmed its writes drained"},
      {"--transfer-timeout-ms", "KVFERRY_TRANSFER_TIMEOUT_MS", &Deadlines::transfer_timeout_ms,
       "prefill: fail a room whose writes in flight made no progress (none completed) for this long"},
      {"--status-retry-ms", "KVFERRY_STATUS_RETRY_MS", &Deadlines::status_retry_ms,
       "decode: ask a source again for a room's status after this long without one (doubling, at most 8 times)"},
      {"--connect-timeout-ms", "KVFERRY_CONNECT_TIMEOUT_MS", &Deadlines::connect_timeout_ms,
       "prefill: fail the rooms waiting for a decode rank whose transport connect has not completed within this"},
      {"--lookup-timeout-ms", "KVFERRY_LOOKUP_TIMEOUT_MS", &Deadlines::lookup_timeout_ms,
       "give up on a prefill rank that never registers with the bootstrap service (or, after its death, never registers again)"},
      {"--engine-timeout-ms", "KVFERRY_ENGINE_TIMEOUT_MS", &Deadlines::engine_timeout_ms,
       "a rank of the same engine silent this long in the per-step agreement is dead"},
      {"--fault-timeout-ms", "KVFERRY_FAULT_TIMEOUT_MS", &Deadlines::fault_timeout_ms,
       "replay: the deadline of a room given a timeout fault"},
      {"--renew-interval-ms", "KVFERRY_RENEW_INTERVAL_MS", &Deadlines::renew_interval_ms,
       "decode: renew the bootstrap deadline of a room without its metadata yet at its sources this often"},
      {"--renew-limit-ms", "KVFERRY_RENEW_LIMIT_MS", &Deadlines::renew_limit_ms,
       "prefill: renewals never keep a room waiting for its metadata longer than this after its opening"},
  };
  return fields;
}

Deadlines deadlines_from_env(std::vector<std::string>* bad) {
  Deadlines d;
  for (const DeadlineField& f : deadline_fields()) {
    const char* v = std::getenv(f.env);
    if (!v || !*v) continue;
    char* end = nullptr;
    long long n = std::strtoll(v, &end, 10);
    if (end && *end == '\0' && n > 0) {
      d.*f.member = n;
    } else if (bad) {
      bad->push_back(std::string(f.env) + "=" + v);
    }
  }
  return d;
}

std::vector<std::string> deadline_args(const Deadlines& d) {
  std::vector<std::string> out;
  for (const DeadlineField& f : deadline_fields()) {
    out.push_back(f.option);
    out.push_back(std::to_string(d.*f.member));
  }
  return out;
}

}  // namespace kvferry
