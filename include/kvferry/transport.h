// The data plane behind one small interface: a registered region per rank, peers, and batched
// one-sided writes that complete only after the data is visible at the peer (flush).
//
// Implementations: UCX (src/transport/ucx; put over shared memory, active messages over TCP) and a
// fault-injecting decorator (src/transport/fault) for tests and replay.
//
// Offsets are bytes from the start of the peer's registered region; a write that does not fit the
// peer's region is rejected locally (kProtocolError) and, where the receiver copies (TCP), again by
// the receiver, so a remote peer never makes us write outside a registered region.
//
// Thread contract: every method may be called from any thread. Completion callbacks run on the
// transport's own progress thread(s): they must be short and must not call back into the
// transport. With TransportOptions::shards > 1 there is one progress thread per shard, so
// callbacks of different rooms may run concurrently on different threads; the callbacks of one
// room's batches run on one thread, in the order the batches were written.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvferry/error.h"

namespace kvferry {

enum class TransportKind { kShm, kTcp };
std::string_view transport_name(TransportKind k);  // "shm" / "tcp"

inline constexpr uint32_t kMaxTransportShards = 8;

struct TransportOptions {
  TransportKind kind = TransportKind::kShm;
  std::string ucx_tls_override;  // empty: chosen from kind
  // Transfer worker shards, 1..kMaxTransportShards: each shard is one UCX worker with its own
  // progress thread (over shm, the thread that copies the data of a put; over tcp, the one that
  // sends and receives). A room's batches always go through the same shard (room % shards), so
  // they stay in order; rooms spread over the shards. All shards share one UCX context and one
  // registered region. Peers with different shard counts interoperate (local shard i talks to the
  // peer's shard i % its shards); shards = 1 is one worker and one thread, as before sharding.
  uint32_t shards = 1;
};

// Local registered memory. Owned by the transport; valid until the transport is destroyed.
struct LocalRegion {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  std::string packed_rkey;  // opaque; ship to peers in the pool registration
};

// What a peer needs to write into our region.
struct RemoteRegionInfo {
  std::string worker_address;  // opaque, from Transport::address()
  std::string packed_rkey;     // opaque, from LocalRegion::packed_rkey
  uint64_t base = 0;           // the peer's region base address as the peer sees it
  uint64_t bytes = 0;          // the peer's region size
};

using PeerId = uint64_t;

struct WriteOp {
  uint64_t local_offset = 0;   // in our region
  uint64_t remote_offset = 0;  // in the peer's region
  uint64_t length = 0;         // bytes
};

struct TransportStats {
  uint64_t bytes_written = 0;
  uint64_t writes = 0;       // individual put / AM operations
  uint64_t batches = 0;
  uint64_t failed_batches = 0;
  uint64_t peers = 0;        // live peers
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Allocates and registers this rank's region of `bytes` (once per transport).
  virtual Result<LocalRegion> create_region(uint64_t bytes) = 0;
  // Registers caller-owned memory [base, base + bytes) as this rank's region instead (once per
  // transport; create_region and register_region exclude each other). The memory must stay valid
  // until the transport is destroyed. Used by the Python module for KV pools the engine allocated
  // (numpy arrays). Over shm, UCX cannot map such memory into the peer, so a put is carried out by
  // the receiver's progress thread (slower than an allocated region; docs/transport.md).
  // Errors: kInvalidArgument (null or empty, or a region exists), kResourceExhausted (UCX refused).
  virtual Result<LocalRegion> register_region(uint8_t* base, uint64_t bytes) = 0;
  // This worker's address, to be shipped to peers.
  virtual std::string address() const = 0;

  // Connects to a peer (peer error-handling mode); returns an id for write().
  virtual Result<PeerId> connect(const RemoteRegionInfo& peer) = 0;
  // Closes the endpoint; in-flight writes complete with an error.
  virtual void disconnect(PeerId peer) = 0;

  // Writes every op then flushes; `done` runs exactly once, with ok only when all data is at the
  // peer. `room` tags the batch (logging and fault injection). Asynchronous.
  virtual void write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
                     std::function<void(Status)> done) = 0;

  // Called (on the progress thread) when a peer's endpoint fails; the peer id is then dead.
  virtual void set_peer_error_handler(std::function<void(PeerId, Status)> handler) = 0;

  virtual TransportStats stats() const = 0;
};

// The UCX implementation (options.shards workers). Errors: kInvalidArgument if options.shards is
// outside 1..kMaxTransportShards, kInternal if UCX cannot be initialised.
Result<std::unique_ptr<Transport>> make_ucx_transport(const TransportOptions& options);

// Wraps `inner`; write() batches tagged with a room in the fail set complete with `code` instead of
// being written (nothing reaches the peer).
class FaultInjectingTransport;

}  // namespace kvferry
