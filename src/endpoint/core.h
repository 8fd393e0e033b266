// EndpointCore: what every rank's manager owns (DESIGN §1 "manager"): the registered KV pool,
// the transport (UCX behind a fault-injecting decorator), the control socket, the failure
// registry, and the queue through which transport completions reach the rank's main thread.
//
// Thread contract: owned and used by the rank's main thread; post()/signal come from the
// transport's progress thread and are synchronized.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "endpoint/peer_monitor.h"
#include "endpoint/waker.h"
#include "kvferry/control.h"
#include "kvferry/deadlines.h"
#include "kvferry/error.h"
#include "kvferry/fault_transport.h"
#include "kvferry/geometry.h"
#include "kvferry/messages.h"
#include "kvferry/registry.h"
#include "kvferry/transport.h"

namespace kvferry {

struct EndpointConfig {
  RankId self;
  PoolLayout layout;
  std::string transport = "shm";  // a registered transport name (kvferry/transport.h)
  uint32_t transfer_shards = 1;  // TransportOptions::shards (1..kMaxTransportShards)
  std::string control_bind = "tcp://127.0.0.1:0";
  Deadlines deadlines;
  // Caller-owned pool memory (e.g. a numpy array from Python) to register instead of letting the
  // transport allocate one: at least layout.total_bytes() bytes, valid until the core is destroyed.
  uint8_t* external_base = nullptr;
  uint64_t external_bytes = 0;
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

class EndpointCore {
 public:
  static Result<std::unique_ptr<EndpointCore>> create(const EndpointConfig& config);
  // Stops the transport first: its last completions still find the queues alive.
  ~EndpointCore();

  const EndpointConfig& config() const { return config_; }
  const RankId& self() const { return config_.self; }
  const PoolLayout& layout() const { return config_.layout; }
  uint8_t* base() const { return region_.base; }
  const LocalRegion& region() const { return region_; }
  Transport& transport() { return *faults_; }
  FaultInjectingTransport& faults() { return *faults_; }
  ControlSocket& control() { return *control_; }
  FailureRegistry& registry() { return registry_; }
  Waker& waker() { return waker_; }
  PeerMonitor& monitor() { return *monitor_; }

  // Encodes and sends a control message; a failure is returned (the caller decides).
  Status send(const std::string& endpoint, const Message& m);

  // Thread-safe: queue a completion for the main thread and wake it.
  void post(TransportEvent e);
  std::vector<TransportEvent> take_events();
  std::vector<PeerError> take_peer_errors();

 private:
  explicit EndpointCore(const EndpointConfig& c);
  EndpointConfig config_;
  std::unique_ptr<FaultInjectingTransport> faults_;
  std::unique_ptr<ControlSocket> control_;
  LocalRegion region_;
  FailureRegistry registry_;
  Waker waker_;
  std::mutex mu_;
  std::vector<TransportEvent> events_;
  std::vector<PeerError> peer_errors_;
  std::unique_ptr<PeerMonitor> monitor_;
};

}  // namespace kvferry
