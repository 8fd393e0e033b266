// Per-rank metrics in the Prometheus text exposition format (version 0.0.4, the format of
// https://prometheus.io/docs/instrumenting/exposition_formats/), served over HTTP by a rank started
// with `kvferry rank --metrics-port P` (GET /metrics) and written to a file at exit
// (`--metrics-file`). docs/metrics.md lists every metric.
//
// Every series carries the constant labels rank="prefill/tp1" (RankId::str()) and role. Names
// follow the Prometheus conventions: counters end in _total, units are base units (_bytes,
// _seconds). Counted when a room is released on this rank (so a room counts once per rank):
//   kvferry_rooms_total{outcome="success"|"failed"}
//   kvferry_sent_bytes_total            prefill: KV and aux bytes this rank wrote
//   kvferry_verified_bytes_total        decode: KV bytes this rank verified
//   kvferry_mismatched_bytes_total      decode: KV bytes that did not match
//   kvferry_failures_total{code, origin_kind="local"|"propagated"}  failed rooms by code_name();
//       local: this rank observed the root cause (is_from_another_rank == false)
//   kvferry_transfer_latency_seconds    histogram, decode: init() (metadata sent) to Success
// Gauges, refreshed by the rank's engine loop (at most every 50 ms, and at exit):
//   kvferry_rooms_in_flight{state="Failed"|"Bootstrapping"|"WaitingForInput"|"Transferring"|"Success"}
//   kvferry_peer_connections            peer ranks of the other engine this rank is connected to
//   kvferry_live_rooms, kvferry_registry_records, kvferry_pages_in_use  leak counters (0 when idle)
// Counters refreshed with the gauges (kvferry/messages.h, incarnations):
//   kvferry_stale_messages_total{kind="registration"|"metadata"|"status"|"heartbeat"}  messages
//       refused because they came from an older incarnation of their sender, or were meant for an
//       earlier incarnation of this rank
//   kvferry_peer_restarts_total         peers of the other engine seen coming back as a new incarnation
//   kvferry_refused_frames_total{kind="outside_plan"|"too_many_peers"|"malformed"|"bad_registration"|
//       "changed_registration"|"unconfirmed_restart"|"future_incarnation"|"foreign"}  frames refused
//       from peers (docs/security.md "Refusals"; every kind is present, 0 included)
//   kvferry_quarantined_pages           decode: pages and aux rows quarantined now (leaked: a failed
//                                       room's source has not confirmed its writes drained; not in
//                                       pages_in_use)
//   kvferry_reclaimed_pages_total       decode: pages and aux rows given back after their quarantine
//                                       ended on every rank of the engine (counter)
//   kvferry_control_frames_total{direction="sent"|"received"}, kvferry_control_bytes_total{direction}
//                                       the rank's control socket (received includes heartbeats)
//   kvferry_heartbeats_sent_total       heartbeat frames sent to peers
//   process_resident_memory_bytes       the process's resident memory (gauge)
//
// Thread contract: init_rank_metrics() once per process before the other calls; every other
// function is thread-safe (the HTTP server reads while the engine loop writes). Without
// init_rank_metrics() (e.g. unit tests of the drivers) rank_metrics() is null.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvferry/error.h"
#include "kvferry/poll.h"

namespace kvferry {

class RankMetrics {
 public:
  explicit RankMetrics(const RankId& self);
  ~RankMetrics();
  RankMetrics(const RankMetrics&) = delete;
  RankMetrics& operator=(const RankMetrics&) = delete;

  // A room released on this rank. `latency_s` < 0: not observed (prefill, or no Success).
  void room_released(bool success, double latency_s);
  void add_sent_bytes(uint64_t bytes);
  void add_verified_bytes(uint64_t verified, uint64_t mismatched);
  void room_failed(ErrorCode code, bool from_another_rank);

  // Gauges. `rooms_by_state[i]`: rooms whose KVPoll is i (Failed=0 ... Success=4).
  void set_rooms_in_flight(const std::array<uint64_t, 5>& rooms_by_state);
  void set_leaks(uint64_t live_rooms, uint64_t records, uint64_t pages_in_use, uint64_t peers);
  // The rank's totals so far (counters: never below what was set before). `stale_by_kind`:
  // registration, metadata, status, heartbeat.
  void set_incarnation_counts(const std::array<uint64_t, 4>& stale_by_kind, uint64_t peer_restarts);
  // Frames refused from peers so far, by kind (endpoint/refusals.h names; counters: never below
  // what was set before): kvferry_refused_frames_total{kind}.
  void set_refusals(const std::vector<std::pair<std::string, uint64_t>>& by_kind);
  void set_quarantined_pages(uint64_t pages);
  // The rank's total so far (a counter: never below what was set before).
  void set_reclaimed_pages(uint64_t pages);
  // Resident memory (docs/transport.md): this rank's registered bytes locked / not locked (gauges),
  // and spans that could not be locked or pre-faulted so far (a counter).
  void set_pool_residency(uint64_t locked_bytes, uint64_t unlocked_bytes, uint64_t warnings);

  // The control plane so far (counters: never below what was set before): frames sent, bytes sent,
  // frames received, bytes received (the rank's control socket), heartbeats sent:
  // kvferry_control_frames_total{direction}, kvferry_control_bytes_total{direction},
  // kvferry_heartbeats_sent_total.
  void set_control_plane(const std::array<uint64_t, 5>& totals);
  // The process's resident memory now (a gauge): process_resident_memory_bytes.
  void set_process_resident_bytes(uint64_t bytes);

  // The whole exposition (text/plain; version=0.0.4).
  std::string exposition() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The calling process's resident memory (VmRSS of /proc/self/statm, bytes); 0 when unreadable.
uint64_t process_resident_bytes();

// The process's metrics (one rank per process).
void init_rank_metrics(const RankId& self);
RankMetrics* rank_metrics();  // null before init_rank_metrics()

namespace security {
struct ClusterKeys;  // src/core/secret.h
}

// Serves GET /metrics (the exposition of `metrics`) on host:port with cpp-httplib.
class MetricsServer {
 public:
  // `host`: an IPv4 or IPv6 address (brackets optional), a host name, or a wildcard ("0.0.0.0":
  // IPv4; "::", "*", "": IPv6 and IPv4), kvferry/net.h. Port 0 picks a free port (port()).
  // Errors: kInvalidArgument for a malformed host, kInternal when host:port cannot be bound.
  // With the process's cluster secret set (docs/security.md), a scrape without
  // "Authorization: Bearer <token>" gets 401; a bad secret file fails the start.
  static Result<std::unique_ptr<MetricsServer>> start(const RankMetrics& metrics, const std::string& host,
                                                      uint16_t port);
  // The same with explicit keys (nullptr: none), which must outlive the server.
  static Result<std::unique_ptr<MetricsServer>> start(const RankMetrics& metrics, const std::string& host,
                                                      uint16_t port, const security::ClusterKeys* keys);
  ~MetricsServer();  // stops and joins
  uint16_t port() const;

 private:
  MetricsServer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes metrics.exposition() to `path` (temporary file, then rename).
Status write_metrics_file(const RankMetrics& metrics, const std::string& path);

}  // namespace kvferry
