// EndpointCore: what every rank's manager owns (docs/manager.md): the registered memory (its map,
// endpoint/memory_map.h: a contiguous KV pool or the engine's own buffers, plus guard rows),
// the transport (UCX, behind the fault-injecting decorator only with fault_injection; the
// manager, src/manager/, builds the core), the control socket, the failure
// registry, and the queue through which transport completions reach the rank's main thread.
//
// Thread contract: owned and used by the rank's main thread; post()/signal come from the
// transport's progress thread and are synchronized.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "device/device_copy.h"
#include "endpoint/connector.h"
#include "endpoint/memory_map.h"
#include "endpoint/peer_monitor.h"
#include "endpoint/refusals.h"
#include "endpoint/waker.h"
#include "kvferry/buffers.h"
#include "kvferry/control.h"
#include "kvferry/deadlines.h"
#include "kvferry/error.h"
#include "kvferry/fault_transport.h"
#include "kvferry/compat.h"
#include "kvferry/geometry.h"
#include "kvferry/messages.h"
#include "kvferry/registry.h"
#include "kvferry/transport.h"

namespace kvferry {

// How far ahead of this rank's clock a peer's incarnation may be (incarnations are CLOCK_REALTIME
// ns of the sender's start, kvferry/messages.h): farther is refused, never believed as a restart.
inline constexpr int64_t kMaxIncarnationSkewNs = 60'000'000'000;

// Restart claims (docs/security.md, "Incarnations"): a random non-zero nonce for a challenge
// (kvferry/messages.h, Heartbeat), from the system's random source.
uint64_t challenge_nonce();
// Whether the process that owned a peer's old control endpoint is gone, as a TCP connect to it
// shows (PeerMonitor::probe, 20 ms): it refuses (the socket closed with its process; a stopped
// process's socket, even with a full accept backlog, never refuses), or nothing answers at all and
// the peer has been silent for kHostGoneSilenceNs (its host is gone; a shorter silence with an
// unanswered probe may be a stopped process whose backlog someone filled). An endpoint that is not
// tcp:// cannot be probed: never gone by this test. `probes` rate-limits the connects.
inline constexpr int64_t kHostGoneSilenceNs = 30'000'000'000;
bool old_endpoint_gone(const std::string& endpoint, int64_t silent_ns, RateLimit& probes, int64_t now_ns);


struct EndpointConfig {
  RankId self;
  PoolLayout layout;
  std::string transport = "shm";  // a registered transport name (kvferry/transport.h)
  uint32_t transfer_shards = 1;  // TransportOptions::shards (1..kMaxTransportShards)
  std::string tcp_congestion = "cubic";  // TransportOptions::tcp_congestion
  ListenAddress control;  // control and heartbeat sockets' bind/advertised host (kvferry/net.h)
  // Wrap the transport in the fault-injecting decorator (faults() non-null).
  bool fault_injection = true;
  bool integrity = false;  // ManagerConfig::integrity
  Deadlines deadlines;
  // Prefill: ManagerConfig::max_decode_instances and decode_instance_idle_ms.
  uint32_t max_decode_instances = 64;
  int64_t decode_instance_idle_ms = 60'000;
  // Caller-owned pool memory (e.g. a numpy array from Python) to register instead of letting the
  // transport allocate one: at least layout.total_bytes() bytes, valid until the core is destroyed.
  uint8_t* external_base = nullptr;
  uint64_t external_bytes = 0;
  // Engine-shaped memory (kvferry/buffers.h): the engine's KV, aux and state buffers, registered
  // instead of a pool. Their KV item_bytes must be layout.page_bytes() (this rank's heads x
  // page_size tokens); layout.num_pages becomes their page count and layout.aux_slots their aux
  // rows (without aux buffers, layout.aux_slots stays the number of aux indices). Empty: the
  // contiguous pool of `layout`.
  std::vector<BufferDesc> buffers;
  // This rank's incarnation (kvferry/messages.h); 0: drawn at creation (next_incarnation()).
  // Tests give one to play an earlier or a later incarnation of a rank.
  uint64_t incarnation = 0;
  // With `buffers`: caller-owned memory for kvferry's guard rows (aux rows x kAuxSlotBytes, valid
  // until the core is destroyed); null: the core allocates them.
  uint8_t* guard_memory = nullptr;
  // The device seam that checks kCuda buffers at registration (device/device_buffers.h); null:
  // the process's CUDA seam, or its refusal. Tests give a host implementation.
  std::shared_ptr<device::DeviceCopy> device_copy;
};

// A write batch completed (on the progress thread), handed to the main thread.
struct TransportEvent {
  uint64_t room = 0;
  uint64_t tag = 0;
  Status status;
  uint64_t bytes = 0;
  PeerId peer = 0;
};

// The transport declared a peer's endpoint failed.
struct PeerError {
  PeerId peer = 0;
  Status status;
};

// A fresh incarnation (kvferry/messages.h): CLOCK_REALTIME ns now, and above every one this
// process drew before (two managers of one process never share one). Thread-safe.
uint64_t next_incarnation();

// What a rank refused because it came from, or was meant for, another incarnation
// (kvferry/messages.h), and the peer restarts it saw (a newer incarnation of a known peer).
struct IncarnationCounts {
  uint64_t stale_registrations = 0;
  uint64_t stale_metadata = 0;
  uint64_t stale_statuses = 0;
  uint64_t stale_heartbeats = 0;
  uint64_t peer_restarts = 0;
  uint64_t stale_total() const {
    return stale_registrations + stale_metadata + stale_statuses + stale_heartbeats;
  }
};

class EndpointCore {
 public:
  static Result<std::unique_ptr<EndpointCore>> create(const EndpointConfig& config);
  // Stops the transport first: its last completions still find the queues alive.
  ~EndpointCore();

  const EndpointConfig& config() const { return config_; }
  const RankId& self() const { return config_.self; }
  uint64_t incarnation() const { return incarnation_; }
  // Counts a refused message (`kind`: a message_name()) and logs it at debug with
  // event "stale_refused" (the replay's report counts those lines; peer_debug(): bounded), naming `why`.
  void refuse_stale(std::string_view kind, const RankId& sender, const std::string& why);
  // Counts and logs (rate-limited, endpoint/refusals.h) a frame refused from `sender`.
  void refuse(Refusal kind, const RankId& sender, const std::string& what, bool quiet = false) {
    refusals_.refuse(kind, what, {.origin = sender.str(), .extra = {{"peer", sender.str()}}}, monotonic_ns(), quiet);
  }
  const RefusalLog& refusals() const { return refusals_; }
  RefusalLog& refusal_log() { return refusals_; }
  // A debug line about a frame a peer sent (a stale one, a status for an unknown room, ...):
  // rate-limited (kPeerDebugLinesPerSecond, burst kPeerDebugLinesBurst), so a peer sending such
  // frames cannot fill a log file; the next line written names how many were not.
  void peer_debug(std::string_view component, std::string what, LogFields fields = {});
  static constexpr double kPeerDebugLinesPerSecond = 20, kPeerDebugLinesBurst = 200;
  // Counts a restart of a peer (a newer incarnation seen).
  void count_peer_restart() { ++incarnations_.peer_restarts; }
  const IncarnationCounts& incarnation_counts() const { return incarnations_; }
  const PoolLayout& layout() const { return config_.layout; }
  // This rank's compatibility fingerprint (kvferry/compat.h), set by its manager once its memory
  // is registered; empty in endpoint tests built without one (then nothing is compared).
  const Compat& compat() const { return compat_; }
  void set_compat(Compat c) { compat_ = std::move(c); }
  // Whether an incompatible peer incarnation gets its error line: the first time it is seen here,
  // and at most one line per peer identity per kIncompatibleLineIntervalNs (a peer that makes up
  // incarnations cannot fill the log; at most kMaxIncompatibleLogged of each kept). Kept by the
  // core: a decode rank's endpoint is rebuilt per prefill instance, the core is not.
  // `*new_incarnation`: the incarnation was not seen incompatible here before (what to tell it).
  bool first_incompatible(const RankId& peer, uint64_t incarnation, int64_t now_ns, bool* new_incarnation = nullptr) {
    if (incompatible_logged_.size() >= kMaxIncompatibleLogged) incompatible_logged_.clear();
    if (incompatible_line_ns_.size() >= kMaxIncompatibleLogged) incompatible_line_ns_.clear();
    const bool fresh_inc = incompatible_logged_.insert({peer, incarnation}).second;
    if (new_incarnation) *new_incarnation = fresh_inc;
    if (!fresh_inc) return false;
    auto [it, fresh] = incompatible_line_ns_.try_emplace(peer, now_ns);
    if (!fresh && now_ns - it->second < kIncompatibleLineIntervalNs) return false;
    it->second = now_ns;
    return true;
  }
  static constexpr size_t kMaxIncompatibleLogged = 1024;
  static constexpr int64_t kIncompatibleLineIntervalNs = 10'000'000'000;
  // The contiguous pool's base (null with engine buffers: use map() / kv_page()).
  uint8_t* base() const { return contiguous_ ? map_.spans().front().base : nullptr; }
  const MemoryMap& map() const { return map_; }
  const MemoryShape& shape() const { return map_.shape(); }
  // Local pointers (memcpy of guard rows, tests filling pages); null when out of range.
  uint8_t* kv_page(size_t buffer, uint64_t page) const {
    return page < shape().num_pages && buffer < shape().kv_offsets.size()
               ? map_.pointer(shape().kv(buffer, page), shape().page_bytes) : nullptr;
  }
  uint8_t* aux_row(size_t buffer, uint64_t row) const {
    return row < shape().aux_rows && buffer < shape().aux_offsets.size()
               ? map_.pointer(shape().aux(buffer, row), shape().aux_item_bytes[buffer]) : nullptr;
  }
  uint8_t* state_row(size_t buffer, uint64_t row) const {
    return row < shape().state_rows && buffer < shape().state_offsets.size()
               ? map_.pointer(shape().state(buffer, row), shape().state_item_bytes[buffer]) : nullptr;
  }
  uint8_t* guard_row(uint64_t row) const { return row < shape().aux_rows ? map_.guard_row(row) : nullptr; }
  // The spans as registered, published in the pool registration.
  const std::vector<RegionSpan>& spans() const { return spans_; }
  Transport& transport() { return *transport_; }
  // The fault decorator (config fault_injection), else nullptr.
  FaultInjectingTransport* faults() { return faults_; }
  ControlSocket& control() { return *control_; }
  // The control endpoint peers are told ("tcp://advertised-host:port").
  const std::string& control_endpoint() const { return control_endpoint_; }
  FailureRegistry& registry() { return registry_; }
  Waker& waker() { return waker_; }
  PeerMonitor& monitor() { return *monitor_; }
  // Transport connects off the main thread (endpoint/connector.h).
  Connector& connector() { return *connector_; }

  // Encodes and sends a control message; a failure is returned (the caller decides). A message
  // whose `incarnation` is 0 is sent with this rank's.
  Status send(const std::string& endpoint, const Message& m);
  // Test-only: a message for which `filter` returns false is dropped as if lost on the way (send()
  // still reports ok). Null: none. Main thread only.
  void set_send_filter(std::function<bool(const std::string& endpoint, const Message& m)> filter) {
    send_filter_ = std::move(filter);
  }
  // Test-only: a message for which `refuse` returns true is not sent and send() fails as when
  // ZeroMQ's queue to the peer is full (kResourceExhausted). Null: none. Main thread only.
  void set_send_refusal(std::function<bool(const std::string& endpoint, const Message& m)> refuse) {
    send_refusal_ = std::move(refuse);
  }

  // Thread-safe: queue a completion for the main thread and wake it.
  void post(TransportEvent e);
  std::vector<TransportEvent> take_events();
  std::vector<PeerError> take_peer_errors();

 private:
  explicit EndpointCore(const EndpointConfig& c);
  // The memory map of config_ (checks engine buffers against the layout; fixes layout pages/rows).
  Status build_map();
  EndpointConfig config_;
  uint64_t incarnation_ = 0;
  Compat compat_;
  std::set<std::pair<RankId, uint64_t>> incompatible_logged_;
  std::map<RankId, int64_t> incompatible_line_ns_;
  IncarnationCounts incarnations_;
  RefusalLog refusals_{"endpoint"};
  RateLimit peer_debug_lines_{kPeerDebugLinesPerSecond, kPeerDebugLinesBurst};
  uint64_t peer_debug_dropped_ = 0;
  std::unique_ptr<Transport> transport_;
  FaultInjectingTransport* faults_ = nullptr;  // transport_ itself when it is the decorator
  std::unique_ptr<ControlSocket> control_;
  std::string control_endpoint_;
  MemoryMap map_;
  bool contiguous_ = true;
  std::vector<RegionSpan> spans_;
  FailureRegistry registry_;
  Waker waker_;
  std::mutex mu_;
  std::vector<TransportEvent> events_;
  std::vector<PeerError> peer_errors_;
  std::unique_ptr<PeerMonitor> monitor_;
  std::unique_ptr<Connector> connector_;  // before transport_ goes (~EndpointCore)
  std::function<bool(const std::string&, const Message&)> send_filter_;
  std::function<bool(const std::string&, const Message&)> send_refusal_;
};

// Challenges this rank sent to peers' known control endpoints (docs/security.md, "Checked without
// the secret"), one outstanding nonce per peer: it stays until answered (a slow answer still
// counts) and is sent again at most once per heartbeat interval. Keys are the caller's (bounded by
// the plan).
class PeerChallenges {
 public:
  void send(EndpointCore& core, const RankId& peer, const std::string& endpoint, int64_t now_ns);
  // True if `hb` answers this set's challenge to its sender (then forgotten).
  bool answered(const Heartbeat& hb);
  void forget(const RankId& peer) { out_.erase(peer); }

 private:
  struct Out {
    uint64_t nonce = 0;
    int64_t sent_ns = 0;
  };
  std::map<RankId, Out> out_;
};

// A dead peer's frames only ask for a proof (PeerMonitor::heard): challenge each such peer's known
// endpoint (`endpoint_of`: null when unknown). Its answer naming the `known` incarnation proves it
// alive: proven_alive() is true for any answer to these challenges, and revives the peer then.
// `monitor`: the one watching those peers (the core's, or a decode endpoint's own).
void challenge_unproven(EndpointCore& core, PeerMonitor& monitor, PeerChallenges& c, int64_t now_ns,
                        const std::function<const std::string*(const RankId&)>& endpoint_of);
bool proven_alive(EndpointCore& core, PeerMonitor& monitor, PeerChallenges& c, const Heartbeat& hb, uint64_t known);
inline void challenge_unproven(EndpointCore& core, PeerChallenges& c, int64_t now_ns,
                               const std::function<const std::string*(const RankId&)>& endpoint_of) {
  challenge_unproven(core, core.monitor(), c, now_ns, endpoint_of);
}
inline bool proven_alive(EndpointCore& core, PeerChallenges& c, const Heartbeat& hb, uint64_t known) {
  return proven_alive(core, core.monitor(), c, hb, known);
}

}  // namespace kvferry
