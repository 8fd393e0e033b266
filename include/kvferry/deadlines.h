// Every deadline of kvferry in one place (docs/design.md §2: "Every state has a deadline").
//
// Each has a default, a KVFERRY_* environment variable, and a CLI option of `kvferry replay` and
// `kvferry rank` (the option wins over the variable, the variable over the default). All in ms.
//
//   field                 env variable                     default  what times out (code)
//   bootstrap_timeout     KVFERRY_BOOTSTRAP_TIMEOUT_MS     300000   prefill: a room's metadata never came (bootstrap_timeout)
//   waiting_timeout       KVFERRY_WAITING_TIMEOUT_MS       300000   decode: metadata sent, data never came (waiting_timeout)
//   prealloc_timeout      KVFERRY_PREALLOC_TIMEOUT_MS      300000   decode: pages never became free (prealloc_timeout)
//   heartbeat_interval    KVFERRY_HEARTBEAT_INTERVAL_MS    100      period of control-plane heartbeats between peer ranks
//   heartbeat_timeout     KVFERRY_HEARTBEAT_TIMEOUT_MS     800      silence after which a peer rank is dead (peer_unreachable)
//                                                                  if its control endpoint refuses connections; one that
//                                                                  still accepts (alive, not scheduled) after 4x this
//   drain_timeout         KVFERRY_DRAIN_TIMEOUT_MS         10000    decode: prefill never confirmed its writes drained (pages quarantined);
//                                                                  prefill: a failed room's writes still in flight this long after
//                                                                  the failure are abandoned (the room is released, decode keeps
//                                                                  its pages quarantined until the writes complete)
//   transfer_timeout      KVFERRY_TRANSFER_TIMEOUT_MS      30000    prefill: a room with writes in flight none of which completed for
//                                                                  this long (a wedged receiver or path) fails (transfer_error,
//                                                                  origin the prefill rank; docs/failure-model.md "Deadlines")
//   status_retry          KVFERRY_STATUS_RETRY_MS          1000     decode: a room whose source sent no status this long after the
//                                                                  metadata (or after the room failed, no terminal one) asks the
//                                                                  source again (its metadata again; the source answers with the
//                                                                  status it sent, if any); the wait doubles, at most 8 asks
//   connect_timeout       KVFERRY_CONNECT_TIMEOUT_MS       5000     prefill: the transport connect to a decode rank that registered
//                                                                  (off the main thread) did not complete: the rooms waiting for it
//                                                                  fail (peer_unreachable, origin that decode rank)
//   lookup_timeout        KVFERRY_LOOKUP_TIMEOUT_MS        60000    a prefill rank never appeared at the bootstrap service, or
//                                                                  a dead one did not appear again there (decode: rooms that
//                                                                  wait for it fail, peer_unreachable)
//   engine_timeout        KVFERRY_ENGINE_TIMEOUT_MS        600      an engine rank stopped answering the per-step agreement
//   fault_timeout         KVFERRY_FAULT_TIMEOUT_MS         1000     replay only: the deadline of a room given a timeout fault
//   renew_interval        KVFERRY_RENEW_INTERVAL_MS        1000     decode: how often a room init()ed but without its metadata sent
//                                                                  yet (the engine has no pages for it yet) renews its bootstrap
//                                                                  deadline at its sources (a Heartbeat naming the room; keep it
//                                                                  under a third of the sources' bootstrap_timeout)
//   renew_limit           KVFERRY_RENEW_LIMIT_MS           3000000  prefill: renewals never move a room's bootstrap deadline past
//                                                                  this after the room's opening (10x bootstrap_timeout's
//                                                                  default): a decode that never sends metadata cannot pin the
//                                                                  pages for longer (bootstrap_timeout, origin the prefill rank)
//
// The first three defaults are SGLang's (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT and
// SGLANG_DISAGGREGATION_WAITING_TIMEOUT are 300 s in python/sglang/srt/disaggregation/).
// Thread contract: value type.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvferry {

struct Deadlines {
  int64_t bootstrap_timeout_ms = 300000;
  int64_t waiting_timeout_ms = 300000;
  int64_t prealloc_timeout_ms = 300000;
  int64_t heartbeat_interval_ms = 100;
  int64_t heartbeat_timeout_ms = 800;
  int64_t drain_timeout_ms = 10000;
  int64_t transfer_timeout_ms = 30000;
  int64_t status_retry_ms = 1000;
  int64_t connect_timeout_ms = 5000;
  int64_t lookup_timeout_ms = 60000;
  int64_t engine_timeout_ms = 600;
  int64_t fault_timeout_ms = 1000;
  int64_t renew_interval_ms = 1000;
  int64_t renew_limit_ms = 3000000;
};

struct DeadlineField {
  const char* option;  // CLI option, e.g. "--bootstrap-timeout-ms"
  const char* env;     // e.g. "KVFERRY_BOOTSTRAP_TIMEOUT_MS"
  int64_t Deadlines::*member;
  const char* help;
};
const std::vector<DeadlineField>& deadline_fields();

// Defaults overridden by any KVFERRY_* variable set in the environment (a value that is not a
// positive integer is ignored and named in *bad, if given).
Deadlines deadlines_from_env(std::vector<std::string>* bad = nullptr);

// "--bootstrap-timeout-ms 300000 --waiting-timeout-ms ..." for passing to a child process.
std::vector<std::string> deadline_args(const Deadlines& d);

}  // namespace kvferry
