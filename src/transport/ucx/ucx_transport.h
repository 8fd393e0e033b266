// The UCX transport (internal header; the public face is make_ucx_transport in transport.h).
//
// One shard of the transport (ShardedTransport, sharded_transport.h, composes N of them).
// One worker, owned by a progress thread: every UCX call on it happens on that thread. The ucp
// context is the transport's own, or (a shard of ShardedTransport) one shared by several shards'
// workers, created by the owner with create_context(shared_workers=true) and outliving them.
// Public methods enqueue closures (CommandQueue) and, where they return a value, wait for
// the thread's answer. The thread sleeps in poll() on the command eventfd and the worker's event
// fd (UCP_FEATURE_WAKEUP + ucp_worker_arm), waking at least every kIdleWakeMs so UCX keepalive
// (dead shared-memory peers) runs.
//
// Memory: a SpanTable (span_table.h) of this rank's spans; each op is resolved to (span, offset
// in span) on both sides before anything is posted: locally against our table, remotely against
// the peer's announced spans (Peer::spans, each with its own unpacked rkey in put mode).
//
// Write path per kind (measurements in docs/transport.md):
//   kShm  one ucp_put_nbx per op into the peer's span: a ucp_mem_map(ALLOCATE)'d region (posix/
//         sysv: a memcpy into the peer's mapping), or caller memory (UCX emulates the put with
//         its own active messages; the receiver's thread copies); then ucp_ep_flush_nbx.
//   kTcp  consecutive ops whose remote ranges touch (a head slice into a narrower row) form one
//         remote range, gathered from the local pieces with an IOV. Ranges of
//         kScatterMaxOpBytes or more go one ucp_am_send_nbx each (header = AmWriteHeader; the
//         receiver receives straight into its region); shorter ones are packed into scatter AMs
//         (header = AmScatterHeader, payload = entry table + data, also sent as an IOV straight
//         from our spans, up to kScatterMaxEntries / kScatterMaxDataBytes each). Ranges are
//         gathered only inside one remote span. The receiver checks every header and every
//         scatter entry against its OWN spans before it writes anything (and, with a room fence
//         installed, against the ranges of the open room the message names: write_fence.h),
//         places the data and replies with one AmAck per message (naming the room); done after
//         all acks.
#pragma once
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/residency.h"
#include "kvferry/transport.h"
#include "transport/ucx/am_wire.h"
#include "transport/ucx/command_queue.h"
#include "transport/ucx/shm_mapping.h"
#include "transport/ucx/shm_segments.h"
#include "transport/ucx/span_table.h"
#include "transport/ucx/ucx_layout.h"

namespace kvferry::ucx {

// Test and measurement knobs; defaults are the production behaviour.
struct UcxTestHooks {
  bool skip_local_bounds_check = false;  // sender: forge out-of-range remote offsets (AM only)
  bool suppress_acks = false;            // receiver: place data but never acknowledge it
  bool plain_mmap_region = false;        // register an mmap'd buffer instead of ALLOCATE
  uint32_t am_send_flags = 0;            // extra ucp_am_send flags (UCP_AM_SEND_FLAG_EAGER/RNDV)
  bool force_put = false;                // put + flush whatever the kind (measurements)
  // sender: told each batch id as it is drawn (tests that forge an ack need the id)
  std::function<void(uint64_t)> on_batch_id;
};

enum class WriteMode { kPut, kActiveMessage };

class UcxTransport final : public Transport {
 public:
  // `shared_context` null: the transport creates (and cleans up) its own context. Otherwise the
  // caller's context from create_context(..., shared_workers=true), which must outlive this.
  static Result<std::unique_ptr<UcxTransport>> create(const TransportOptions& options,
                                                      const UcxTestHooks& hooks = {},
                                                      ucp_context_h shared_context = nullptr);
  // A ucp context configured for `options` (UCX_TLS, keepalive, features of the write mode).
  // shared_workers: several workers (threads) will use it (UCP_PARAM_FIELD_MT_WORKERS_SHARED).
  // Errors: kInternal. The caller releases it with ucp_cleanup after every worker is gone.
  static Result<ucp_context_h> create_context(const TransportOptions& options,
                                              const UcxTestHooks& hooks, bool shared_workers);
  static WriteMode mode_for(const TransportOptions& options, const UcxTestHooks& hooks);
  ~UcxTransport() override;

  Result<LocalRegion> create_region(uint64_t bytes) override;
  Result<std::vector<LocalRegion>> register_spans(const std::vector<MemorySpan>& spans) override;
  TransportCaps caps() const override;
  std::string address() const override { return address_; }
  Result<PeerId> connect(const RemoteRegionInfo& peer) override;
  // tcp (active-message mode) only; elsewhere Ok without doing anything.
  Status connect_reverse(const std::string& peer_address) override;
  // Live reverse endpoints per transport; beyond it connect_reverse answers kResourceExhausted
  // (a decode rank opens one per prefill rank it receives from, per shard).
  static constexpr size_t kMaxReversePeers = 1024;
  void disconnect(PeerId peer) override;
  void write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
             std::function<void(Status)> done) override;
  void set_peer_error_handler(std::function<void(PeerId, Status)> handler) override;
  void set_write_fence(std::shared_ptr<WriteFence> fence) override;
  TransportStats stats() const override;

  // Shards of one context: this transport writes from and receives into `spans`, which another
  // shard on the same context registered (and keeps registered until after this transport is
  // destroyed); nothing is registered here. Once, instead of create_region / register_spans.
  // Errors: kInvalidArgument (no spans, or memory is registered already).
  Status share_spans(std::vector<LocalSpanView> spans);

  WriteMode mode() const { return mode_; }
  // ucp_ep_print_info() of a peer's endpoint (which lanes/transports UCX chose); "" if unknown.
  std::string describe_peer(PeerId peer);
  // Incoming AM writes this transport refused (header outside its region or malformed).
  uint64_t rejected_incoming() const { return rejected_incoming_.load(); }
  // Acks for one of our pings or batches that came from another endpoint than the one it went
  // out on, or from none (dropped; handle_am_ack in ucx_write.cc).
  uint64_t foreign_acks() const { return foreign_acks_.load(); }
  // Incoming AM writes the room fence refused (room not open, or bytes outside the room; nothing
  // placed, the writer told with the refusal). 0 without a fence.
  uint64_t fence_refusals() const { return fence_refusals_.load(); }
  // At most one log line per this interval about fence refusals (the count since the last line).
  static constexpr int64_t kFenceLogIntervalNs = 1'000'000'000;

  static constexpr int kIdleWakeMs = 100;
  // connect() returns once wire-up with the peer completed (shm: ep flush; tcp: ping + ack round
  // trip), or fails with kPeerUnreachable after this.
  static constexpr std::chrono::milliseconds kConnectTimeout{5000};

 private:
  struct Peer;
  struct Batch;
  struct RecvCtx;
  struct AckMsg;
  struct ConnectCtx;

  UcxTransport(const TransportOptions& options, const UcxTestHooks& hooks,
               ucp_context_h shared_context);
  Status start();
  void run(std::function<void(Status)> started);
  Status init_ucx();
  void teardown();
  bool post(std::function<void()> fn);
  template <typename T>
  Result<T> call(std::function<Result<T>()> fn);
  bool on_progress_thread() const;

  // Progress-thread only (ucx_transport.cc).
  Result<LocalRegion> do_create_region(uint64_t bytes);
  // `spans` passed check_spans; registers each (in order), or nothing on failure.
  Result<std::vector<LocalRegion>> do_register_spans(const std::vector<MemorySpan>& spans);
  // ucp_mem_map of [address, +bytes) (address null: UCX allocates) and its packed rkey.
  Result<LocalRegion> map_span(void* address, uint64_t bytes, MemoryKind memory);
  // Locks and pre-faults [base, +bytes) (core/residency.h): `own` a span this rank registered
  // (counted in locked_bytes_/unlocked_bytes_), else a peer's span as this process maps it.
  void keep_resident(void* base, uint64_t bytes, const std::string& what, bool own);
  // Sets options_.tcp_congestion on UCX's tcp sockets: our listeners and the sockets of the peer
  // whose worker address is `peer_address` (empty: listeners and accepted ones only).
  void tune_tcp_sockets(std::string_view peer_address);
  void unmap_all();

  // Progress-thread only (ucx_peers.cc).
  void start_connect(const RemoteRegionInfo& info, std::function<void(Result<PeerId>)> reply);
  // connect_reverse on the progress thread: a Peer without spans, flagged reverse.
  void start_reverse(const std::string& address, std::function<void(Result<PeerId>)> reply);
  // The endpoint creation and wire-up of start_connect and start_reverse; `peer` is new, with
  // its spans set (none for a reverse one).
  // `holds` (put mode): per span in `order`, the segment its checked rkey names, held until unpacked.
  void create_and_wire(std::unique_ptr<Peer> peer, const std::string& address, const std::vector<size_t>& order,
                       const RemoteRegionInfo* info, std::vector<SegmentHold>* holds,
                       std::function<void(Result<PeerId>)> reply);
  // Put mode: a peer's address and every rkey checked (ucx_layout.h) and each named segment held
  // (shm_segments.h), all before any UCX call. Errors: kProtocolError.
  Status check_peer_keys(const RemoteRegionInfo& info, const std::vector<size_t>& order,
                         std::vector<SegmentHold>* holds);
  // What this rank's own UCX packs (own address, a probe rkey in put mode): ucx_layout.h.
  Status learn_layout();
  void complete_connect(ConnectCtx& ctx, const Status& status);
  void check_connect_deadlines();
  void release_connect_if_idle(ConnectCtx& ctx);
  static void on_connect_flushed(void* request, ucs_status_t status, void* user_data);
  void do_disconnect(PeerId id);
  // Put mode: every span of `peer` whose rkey is a shared-memory mapping must lie where UCX maps
  // that peer, in no memory of ours or another peer's (shm_mapping.h). Records where they are.
  Status check_mapped_spans(Peer& peer);
  void handle_ep_error(Peer& peer, ucs_status_t status);
  void close_peer(Peer& peer, bool force);
  void finish_close(Peer& peer);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void on_close_done(void* request, ucs_status_t status, void* user_data);

  // Progress-thread only (ucx_write.cc).
  void do_write(PeerId id, uint64_t room, std::vector<WriteOp> ops,
                std::function<void(Status)> done);
  Status validate_ops(const Peer& peer, const std::vector<WriteOp>& ops) const;
  uint8_t* local_ptr(uint64_t offset, uint64_t length) const { return spans_.resolve(offset, length); }
  void issue_puts(Peer& peer, Batch& batch, const std::vector<WriteOp>& ops);
  void issue_am_writes(Peer& peer, Batch& batch, const std::vector<WriteOp>& ops);
  void finish(Batch& batch, Status status);
  void release_if_idle(Batch& batch);
  void fail_peer_batches(Peer& peer, const Status& status);
  Status register_am_handlers();
  bool send_scatter(Peer& peer, Batch& batch, size_t first_iov, size_t first_entry,
                    uint32_t count, uint64_t data_bytes);
  bool send_write(Peer& peer, Batch& batch, const std::vector<WriteOp>& ops, size_t first,
                  size_t end, uint64_t length);
  void send_ack(ucp_ep_h reply_ep, uint64_t batch_id, uint64_t room, ErrorCode code,
                AmRefusal refusal = AmRefusal::kNone, bool ping = false);
  // The room fence (receiver side; write_fence.h): a Pin on `room` for [offset, +length), or an
  // empty Pin with *verdict saying why (counted and logged, rate-limited). Without a fence: an
  // empty Pin and kAdmitted.
  WriteFence::Pin fence_pin(uint64_t room, uint64_t offset, uint64_t length, bool check_range,
                            FenceVerdict* verdict);
  void count_fence_refusal(FenceVerdict v, uint64_t room, uint64_t offset, uint64_t length);
  uint64_t fresh_batch_id();  // random, nonzero, not in batches_ or pings_ (ucx_write.cc)
  ucs_status_t handle_am_scatter(const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);
  // Fence, span checks and copy of a scatter payload (ucx_receive.cc); the ack's code.
  ErrorCode place_scatter_payload(const AmScatterHeader& h, const uint8_t* payload, size_t length,
                                  AmRefusal* refusal);
  std::unique_ptr<uint8_t[]> take_bounce();
  void return_bounce(std::unique_ptr<uint8_t[]> buf);
  ucs_status_t handle_am_write(const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  void handle_am_ack(const void* data, size_t length, ucp_ep_h from);
  // false: counted in foreign_acks_ (another endpoint, none, or another room)
  bool ack_is_from(ucp_ep_h from, PeerId peer, uint64_t ack_room, uint64_t room);
  std::string peer_name(PeerId id) const;
  static void on_flush_done(void* request, ucs_status_t status, void* user_data);
  static void on_am_sent(void* request, ucs_status_t status, void* user_data);
  static void on_ack_sent(void* request, ucs_status_t status, void* user_data);
  static void on_recv_done(void* request, ucs_status_t status, size_t length, void* user_data);
  static ucs_status_t am_write_cb(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t am_scatter_cb(void* arg, const void* header, size_t header_length,
                                    void* data, size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t am_ping_cb(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t am_ack_cb(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);

  const TransportOptions options_;
  const UcxTestHooks hooks_;
  const WriteMode mode_;
  std::string address_;  // set before start() returns, immutable afterwards
  CommandQueue commands_;
  std::thread thread_;

  const bool owns_context_;
  // Owned by the progress thread (context_: unless shared).
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_efd_ = -1;
  std::vector<ucp_mem_h> memhs_;  // what this transport mapped (a sharing shard: none)
  void* plain_mmap_ = nullptr;
  uint64_t plain_mmap_bytes_ = 0;
  SpanTable spans_;               // empty until memory is registered
  uint64_t memory_types_ = 0;     // ucp_context_query: UCS_BIT(ucs_memory_type_t); set in start()
  LocalUcxLayout layout_;         // our own address and rkeys as UCX packs them (learn_layout)
  std::string tls_;               // UCX_TLS this transport's context uses
  bool stop_ = false;
  bool shutting_down_ = false;
  PeerId next_peer_id_ = 1;
  uint64_t next_batch_id_ = 1;  // only if libsodium cannot initialise (fresh_batch_id)
  std::unordered_map<PeerId, std::unique_ptr<Peer>> peers_;
  std::unordered_map<uint64_t, std::unique_ptr<Batch>> batches_;
  std::unordered_set<RecvCtx*> recvs_;
  std::vector<std::unique_ptr<uint8_t[]>> bounce_free_;  // kScatterMaxPayload each, reused
  std::unordered_set<AckMsg*> acks_in_flight_;
  std::unordered_set<ConnectCtx*> connects_;               // connect() calls in progress
  std::unordered_map<uint64_t, ConnectCtx*> pings_;        // AM mode: ping token -> connect
  std::function<void(PeerId, Status)> peer_error_handler_;
  std::shared_ptr<WriteFence> fence_;  // null: no room fence (span checks only)
  // Per kind of refusal ([0] room not open, [1] bytes outside the room): the last log line
  // (monotonic ns) and the refusals since it.
  int64_t fence_logged_ns_[2] = {0, 0};
  uint64_t fence_unlogged_[2] = {0, 0};
  std::atomic<uint64_t> fence_refusals_{0};

  std::atomic<uint64_t> bytes_written_{0}, writes_{0}, batches_done_{0}, failed_batches_{0},
      live_peers_{0}, rejected_incoming_{0}, foreign_acks_{0};
  // Resident memory (docs/transport.md): own registered bytes locked / not locked, and spans (own
  // or a peer's mapping) that could not be locked or pre-faulted.
  std::atomic<uint64_t> locked_bytes_{0}, unlocked_bytes_{0}, residency_warnings_{0};
  // TCP congestion control of UCX's sockets (tcp_congestion.h): counted; a refusal logged at
  // warning once per transport.
  std::atomic<uint64_t> tcp_sockets_tuned_{0}, tcp_congestion_failures_{0};
  std::atomic<uint64_t> reverse_peers_{0};  // live reverse peers (TransportStats::reverse_peers)
  std::atomic<bool> congestion_warned_{false};
  std::atomic<bool> residency_warned_{false}, residency_noted_{false};
  ResidencyOptions residency_ = residency_options_from_env();
  std::atomic<std::thread::id> thread_id_{};
};

struct UcxTransport::Peer {
  enum class State { kLive, kFailed, kDisconnected };
  UcxTransport* owner = nullptr;
  PeerId id = 0;
  ucp_ep_h ep = nullptr;       // null once the close completed
  struct Span {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint64_t base = 0;
    ucp_rkey_h rkey = nullptr;  // put mode only
    uintptr_t local = 0;        // where a shared-memory span is mapped here, once checked (shm_mapping.h)
    bool segment = false;       // its rkey names a shared-memory segment (SegmentClaim)
    std::vector<Mapping> fresh; // the mappings of that segment its unpack created
  };
  std::vector<Span> spans;     // the peer's spans, sorted by offset
  void destroy_rkeys();
  State state = State::kLive;
  Status error;                // why the peer is no longer live
  bool closing = false;
  bool erase_when_closed = false;
  bool connecting = true;      // until the wire-up flush completed (or failed)
  bool wired = false;          // the wire-up completed: a graceful close can flush
  // connect_reverse: never written to, not counted in TransportStats::peers, its failure not
  // reported to the peer error handler; `address` is the peer's (one reverse peer per address).
  bool reverse = false;
  std::string address;
  std::unordered_set<uint64_t> batches;  // unfinished batch ids
};

// One write() call. Lives until finished and every UCX request that points at it has returned.
struct UcxTransport::Batch {
  UcxTransport* owner = nullptr;
  uint64_t id = 0;
  PeerId peer = 0;
  uint64_t room = 0;
  std::function<void(Status)> done;
  uint64_t bytes = 0;
  uint32_t requests = 0;  // outstanding UCX requests carrying this batch as user_data
  uint64_t acks = 0;      // AM mode: acks still expected
  bool finished = false;
  // AM mode: kept alive until the sends complete (reserved up front: never reallocated).
  std::vector<AmWriteHeader> headers;
  std::vector<AmScatterHeader> scatter_headers;
  std::vector<AmScatterEntry> entries;  // every scatter message's entry table, back to back
  std::vector<ucp_dt_iov_t> iovs;       // per scatter message: its table, then its pieces
  std::vector<ucp_dt_iov_t> gather_iovs;  // per gathered write: its local pieces
};

// A rendezvous AM receive in progress (receiver side).
struct UcxTransport::RecvCtx {
  UcxTransport* owner = nullptr;
  ucp_ep_h reply_ep = nullptr;
  uint64_t batch_id = 0;
  uint64_t room = 0;
  WriteFence::Pin pin;                  // a write received straight into the room's pages
  bool scatter = false;                 // a scatter message received into `bounce`
  AmScatterHeader scatter_header;
  size_t length = 0;
  std::unique_ptr<uint8_t[]> bounce;
};

// A connect() waiting for wire-up: put mode flushes the ep; AM mode sends a ping and waits for
// the peer's ack (a full round trip, so the peer's wire-up reply has certainly left its worker).
// Freed once answered and its request returned (or at teardown).
struct UcxTransport::ConnectCtx {
  UcxTransport* owner = nullptr;
  PeerId id = 0;
  std::chrono::steady_clock::time_point deadline;
  std::function<void(Result<PeerId>)> reply;  // empty once answered
  uint32_t requests = 0;                      // flush or ping send outstanding
  uint64_t ping_token = 0;                    // AM mode
  AmAck ping;                                 // AM mode: the ping payload
  std::string peer_address;                   // the peer's worker address (tune_tcp_sockets)
};

// An ack being sent (receiver side); freed when the send completes.
struct UcxTransport::AckMsg {
  UcxTransport* owner = nullptr;
  AmAck ack;
};

}  // namespace kvferry::ucx
