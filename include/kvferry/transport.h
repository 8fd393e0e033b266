// The data plane behind one small interface: registered memory per rank, peers, and batched
// one-sided writes that complete only after the data is visible at the peer (flush).
//
// Implementations: UCX (src/transport/ucx; put over shared memory, active messages over TCP),
// chosen by name through a registry (make_transport: "shm", "tcp"), and a fault-injecting
// decorator (kvferry/fault_transport.h) that callers add only when a test or fault plan asks.
//
// Memory (docs/transport.md "Spans"): every rank has one *offset space*, the union of its
// registered spans, each placed at an `offset` chosen by the caller (or at 0 for create_region).
// A WriteOp's local_offset is in our offset space, its remote_offset in the peer's. An op must lie
// inside ONE span on each side; the sender checks both (against the spans the peer announced in
// RemoteRegionInfo) before anything is posted, and where the receiver copies (TCP) the receiver
// checks again against its OWN spans, never the sender's claim, and against its room fence if one
// is installed (set_write_fence). Anything else is refused with kProtocolError, overflow-safe.
// Zero-length ops are checked the same way and write nothing.
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
#include <string_view>
#include <vector>

#include "kvferry/buffers.h"
#include "kvferry/error.h"
#include "kvferry/write_fence.h"

namespace kvferry {

// The UCX transport's flavour. Chosen from the registered name by make_transport ("shm", "tcp");
// set directly only by code that calls make_ucx_transport (tests, measurements).
enum class TransportKind { kShm, kTcp };
std::string_view transport_name(TransportKind k);  // "shm" / "tcp"

inline constexpr uint32_t kMaxTransportShards = 8;
// Bounds on what a rank registers and on what a peer may announce (RemoteRegionInfo).
inline constexpr size_t kMaxTransportSpans = 1024;
inline constexpr size_t kMaxWorkerAddressBytes = 1u << 16;
inline constexpr size_t kMaxPackedRkeyBytes = 1u << 16;

struct TransportOptions {
  TransportKind kind = TransportKind::kShm;  // make_transport sets it from the name
  std::string ucx_tls_override;  // empty: chosen from kind
  // Transfer worker shards, 1..kMaxTransportShards: each shard is one UCX worker with its own
  // progress thread (over shm, the thread that copies the data of a put; over tcp, the one that
  // sends and receives). A room's batches always go through the same shard (room % shards), so
  // they stay in order; rooms spread over the shards. All shards share one UCX context and the
  // registered spans. Peers with different shard counts interoperate (local shard i talks to the
  // peer's shard i % its shards); shards = 1 is one worker and one thread, as before sharding.
  uint32_t shards = 1;
  // The TCP congestion control of the sockets UCX opens for this transport (tcp lane only;
  // docs/transport.md "TCP congestion control"): a name of the kernel's
  // tcp_available_congestion_control (without privileges, of tcp_allowed_congestion_control),
  // or empty to leave the host's default. Where the kernel refuses it, the sockets keep the
  // host's default: a warning (once) and TransportStats::tcp_congestion_failures.
  std::string tcp_congestion = "cubic";
};

// Caller-owned memory to register: [base, base + bytes) placed at [offset, offset + bytes) of
// this rank's offset space. `memory`: where it lives (kCuda only where caps() lists it).
struct MemorySpan {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  uint64_t offset = 0;
  MemoryKind memory = MemoryKind::kHost;
};

// One registered span. Owned by the transport (create_region) or by the caller (register_spans);
// the registration is valid until the transport is destroyed.
struct LocalRegion {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  uint64_t offset = 0;      // where the span sits in this rank's offset space
  std::string packed_rkey;  // opaque; ship to peers (RemoteSpan::packed_rkey)
};

// One span of a peer, as the peer registered it.
struct RemoteSpan {
  uint64_t offset = 0;      // in the peer's offset space
  uint64_t bytes = 0;
  uint64_t base = 0;        // the span's address as the peer sees it (LocalRegion::base)
  std::string packed_rkey;  // LocalRegion::packed_rkey (put transports need it; tcp ignores it)
};

// What a peer needs to write into our memory. Checked by connect() before any UCX call: a worker
// address of 1..kMaxWorkerAddressBytes, 1..kMaxTransportSpans spans, none empty, none
// overflowing (offset + bytes, base + bytes), none overlapping another in the offset space, and
// over shm a packed rkey of 1..kMaxPackedRkeyBytes each. Otherwise kProtocolError.
struct RemoteRegionInfo {
  std::string worker_address;  // opaque, from Transport::address()
  std::vector<RemoteSpan> spans;
};

// The peer's view of our registered spans (what to ship in a pool registration).
RemoteRegionInfo remote_info_for(std::string worker_address, const std::vector<LocalRegion>& spans);

using PeerId = uint64_t;

struct WriteOp {
  uint64_t local_offset = 0;   // in our offset space
  uint64_t remote_offset = 0;  // in the peer's offset space
  uint64_t length = 0;         // bytes
};

struct TransportStats {
  uint64_t bytes_written = 0;
  uint64_t writes = 0;       // individual put / AM operations
  uint64_t batches = 0;
  uint64_t failed_batches = 0;
  uint64_t peers = 0;        // live peers
  // Resident memory (docs/transport.md "Resident memory"): bytes of this rank's registered host
  // memory that are locked (mlock) / that could not be locked (RLIMIT_MEMLOCK, no CAP_IPC_LOCK:
  // pre-faulted only, so the kernel may reclaim and fault them again), and how many spans (own,
  // or a peer's shared memory as mapped here) could not be locked or pre-faulted.
  uint64_t locked_bytes = 0;
  uint64_t unlocked_bytes = 0;
  uint64_t residency_warnings = 0;
  // TCP congestion control (TransportOptions::tcp_congestion): UCX sockets switched to it, and
  // sockets where the kernel refused it.
  uint64_t tcp_sockets_tuned = 0;
  uint64_t tcp_congestion_failures = 0;
  uint64_t reverse_peers = 0;  // connect_reverse endpoints open (tcp)
};

// What an instance can do (queried from UCX where it matters).
struct TransportCaps {
  std::string name;                      // registry name ("shm", "tcp")
  std::vector<MemoryKind> memory_kinds;  // what register_spans accepts; kHost always
  // Writes into spans of create_region are one-sided (the peer's CPU does not copy).
  bool one_sided_put = false;
  // Writes are copied by the receiver's progress thread: every write (tcp), or writes into
  // caller-owned spans (shm, where UCX cannot map caller memory into the peer).
  bool receiver_copy = false;
  uint32_t max_shards = kMaxTransportShards;
  size_t max_spans = kMaxTransportSpans;
  // Why kCuda is missing from memory_kinds ("" when it is listed): names the UCX support needed.
  std::string cuda_missing;
  bool supports(MemoryKind k) const;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Allocates one UCX-mapped span of `bytes` at offset 0 (over shm a peer's put is a memcpy into
  // it: the fast path). Once per transport; create_region and register_spans exclude each other.
  // Errors: kInvalidArgument (0 bytes, memory already registered), kResourceExhausted.
  virtual Result<LocalRegion> create_region(uint64_t bytes) = 0;
  // Registers caller-owned spans (engine buffers, kvferry's own rows) as this rank's offset space;
  // returns one LocalRegion per span, in the order given. Once per transport. The memory must stay
  // valid until the transport is destroyed. Over shm, UCX cannot map such memory into the peer, so
  // a put into it is carried out by the receiver's progress thread (docs/transport.md).
  // Errors: kInvalidArgument (no spans or more than kMaxTransportSpans, a null base, an empty span,
  // offset + bytes overflowing, spans overlapping in the offset space, memory already registered,
  // a memory kind caps() does not list: the message names the missing UCX support),
  // kResourceExhausted (UCX refused a registration; nothing stays registered then).
  virtual Result<std::vector<LocalRegion>> register_spans(const std::vector<MemorySpan>& spans) = 0;
  virtual TransportCaps caps() const = 0;
  // This worker's address, to be shipped to peers.
  virtual std::string address() const = 0;

  // Connects to a peer (peer error-handling mode); returns an id for write(). Errors:
  // kProtocolError (RemoteRegionInfo fails its checks, or UCX rejects a remote key),
  // kPeerUnreachable.
  virtual Result<PeerId> connect(const RemoteRegionInfo& peer) = 0;
  // Closes the endpoint; in-flight writes complete with an error.
  virtual void disconnect(PeerId peer) = 0;
  // A peer that is about to connect() to us and write: open the connection from this side first,
  // so that the peer's connect finds it and writes over it (docs/transport.md "TCP congestion
  // control": over tcp the peer's sending socket is then one its own listener accepted, born with
  // kvferry's congestion control, instead of one it connected and switched later). `peer_address`:
  // the peer's address(). Nothing is written to the peer, but its acknowledgements may travel back
  // over this endpoint: it stays open until this transport is destroyed or the peer's side fails or
  // closes. Blocks until the connection is wired up (at most the connect timeout). Optional: the
  // default does nothing, and a failure only costs the peer's connect its reuse. Errors:
  // kProtocolError (an address that fails the checks of connect()), kPeerUnreachable,
  // kResourceExhausted (a bounded number of such endpoints is open).
  virtual Status connect_reverse(const std::string& peer_address) {
    (void)peer_address;
    return Status::Ok();
  }

  // Writes every op then flushes; `done` runs exactly once, with ok only when all data is at the
  // peer. `room` tags the batch (logging, sharding and fault injection). Asynchronous. An op
  // outside one span on either side fails the whole batch with kProtocolError, nothing written.
  virtual void write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
                     std::function<void(Status)> done) = 0;

  // Called (on the progress thread) when a peer's endpoint fails; the peer id is then dead.
  virtual void set_peer_error_handler(std::function<void(PeerId, Status)> handler) = 0;

  // Installs the receiver-side room fence (kvferry/write_fence.h): where this transport copies
  // incoming writes itself (tcp), it places a write only into the ranges of the open room the
  // write names, and refuses anything else (the writer's batch fails: kTransferError for a room
  // that is not open, kProtocolError for bytes outside the room). Without a fence only the span
  // checks apply. Over shm a put is the writer's own memcpy into our mapping: nothing here sees
  // it, so the fence cannot apply (docs/security.md "The room fence"). Call before peers connect;
  // the default does nothing (transports that never copy on the receiver's side).
  virtual void set_write_fence(std::shared_ptr<WriteFence> fence) { (void)fence; }

  virtual TransportStats stats() const = 0;
};

// Recycled op lists (src/core/write_ops_pool.cc). A chunk of a fragmented room is one op per page
// (or token head slice) per KV buffer: hundreds of thousands of ops, several MiB, which the
// allocator maps fresh and unmaps again for every chunk, so each chunk paid a page fault per 4 KiB
// of its op list. A writer takes an empty list (with the capacity an earlier batch left) and a
// transport gives the list back once it has issued the ops. Process-wide, thread-safe; keeps at
// most 16 lists of 64 KiB to 64 MiB each (smaller ones come from the heap cheaply).
std::vector<WriteOp> take_write_ops();
void recycle_write_ops(std::vector<WriteOp>&& ops);

// The UCX implementation of options.kind (options.shards workers). Errors: kInvalidArgument if
// options.shards is outside 1..kMaxTransportShards, kInternal if UCX cannot be initialised.
Result<std::unique_ptr<Transport>> make_ucx_transport(const TransportOptions& options);

// ---- registry of named transports: the one place a transport name is parsed ----------------
using TransportFactoryFn =
    std::function<Result<std::unique_ptr<Transport>>(const TransportOptions&)>;
struct TransportFactory {
  std::string name;         // e.g. "shm"
  std::string description;  // one line, for help texts
  TransportFactoryFn make;
};
// Adds a factory (built in: "shm", "tcp"). Errors: kInvalidArgument (empty name or no factory,
// or the name is taken). Thread-safe.
Status register_transport(TransportFactory factory);
// Registered names, sorted.
std::vector<std::string> transport_names();
// ok if `name` is registered; else kInvalidArgument "unknown transport 'x' (known: shm, tcp)".
Status check_transport_name(std::string_view name);
// One line per registered transport: "name: description".
std::string describe_transports();
// Builds the transport registered as `name` with `options` (kind is set by the factory).
// Errors: check_transport_name's, else the factory's.
Result<std::unique_ptr<Transport>> make_transport(std::string_view name,
                                                  const TransportOptions& options = {});

}  // namespace kvferry
