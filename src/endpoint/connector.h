// Connector: transport connects off the rank's main thread (issue 12: a connect never blocks the
// engine). Transport::connect waits for wire-up with the peer (UCX: up to its wire-up timeout per
// shard), so each connect runs on a thread of its own; its result is queued and the rank's waker
// signalled, and the main thread takes it from take_done(). The caller bounds the wait with its
// own deadline (the rooms waiting for the peer fail then, prefill_registration.cc); a result that
// comes after that is still delivered and the caller disconnects what it no longer wants.
//
// Bounds: at most kMaxInFlight connects at once (start() refuses more).
// Thread contract: start(), take_done() and in_flight() from the owner's thread; the destructor
// joins every connect in flight (each ends by the transport's own wire-up timeout) and must run
// before the transport is destroyed.
#pragma once
#include <cstdint>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "endpoint/waker.h"
#include "kvferry/error.h"
#include "kvferry/transport.h"

namespace kvferry {

class Connector {
 public:
  static constexpr size_t kMaxInFlight = 64;
  struct Done {
    uint64_t id = 0;  // start()'s
    Result<PeerId> peer = Status(ErrorCode::kInternal, "not connected");
  };

  Connector(Transport& transport, Waker& waker) : transport_(transport), waker_(waker) {}
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // Starts transport.connect(info) on a thread of its own; `id` comes back with its result.
  // False (nothing started) when kMaxInFlight connects are in flight.
  bool start(uint64_t id, RemoteRegionInfo info);
  // Connects finished since the last call, in the order they finished.
  std::vector<Done> take_done();
  size_t in_flight() const;

 private:
  struct Job {
    std::thread thread;
    bool finished = false;  // under mu_
  };
  Transport& transport_;
  Waker& waker_;
  mutable std::mutex mu_;
  std::list<Job> jobs_;
  std::vector<Done> done_;
};

}  // namespace kvferry
