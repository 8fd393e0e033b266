// kvferry::Manager: one rank of a prefill or decode engine, put together in one place
// (docs/manager.md). It owns the transport (with registered memory: the engine's buffers,
// kvferry/buffers.h), the control socket, the peer monitor (heartbeats), the failure registry and,
// unless the caller pumps it, a progress thread. It hands out one Sender per room (prefill) or one
// Receiver per room (decode); their calls follow a serving engine's scheduler:
//
//   prefill: s = mgr.sender(room); s->init(num_pages, aux_index);
//            s->send(pages, {}, false) ... s->send(last_pages_or_none, state_indices, true);
//            (layer-wise: s->send(pages, LayerRange{l, l + 1}, {}, false) per layer as computed)
//            poll() every step until Success or Failed; failure(); abort(); metrics().
//   decode:  r = mgr.receiver(room, prefill_bootstrap_address); r->init(prefill_dp_rank);
//            r->send_metadata(pages, aux_index, state_indices); poll(); failure(); abort();
//            free the room's pages and aux row only once r->release_safe() is true.
//
// Failed does not imply release-safe: a prefill may still be writing into the room's pages.
// release_safe() is true once no write of any prefill source can still reach the room's pages,
// aux rows and state rows (every source sent its terminal status, or died, or the drain deadline
// passed: then the pages are reported as quarantined and must not be reused).
//
// A room that concluded here (Success) and then failed on another rank (fail_from_engine,
// fail_from_agreement, or a failure told by a peer) polls Failed from then on, with that
// failure(): the engine's room failed. No write can reach it any more (release_safe() holds).
// Errors: calls return Status / Result (kInvalidArgument for a bad call, naming the value; nothing
// is sent then). A room's failure is never an error of a call: it is KVPoll::Failed plus the
// room's KVTransferError from failure() (non-destructive; the same answer every time).
// Units: pages are indices of KV buffer items (page_size tokens each); rows are aux/state items;
// times are CLOCK_MONOTONIC ns unless named _ms.
// Thread contract: with ManagerConfig::progress_thread (the default) every method of Manager,
// Sender and Receiver may be called from any thread (one internal mutex); the progress thread
// never calls back into the caller. Without it the caller pumps: it calls progress() whenever one
// of wait_fds() is readable, or at least every progress_interval_ms, and makes every call from
// that one thread. Senders and receivers must not outlive their manager.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvferry/buffers.h"
#include "kvferry/deadlines.h"
#include "kvferry/error.h"
#include "kvferry/geometry.h"
#include "kvferry/net.h"
#include "kvferry/poll.h"
#include "kvferry/transport.h"

namespace kvferry {

struct ManagerConfig {
  RankId self;                   // role, engine_id, tp_rank, dp_rank
  uint32_t tp_size = 1;
  uint32_t peer_tp_size = 0;     // the other engine's TP size (0: same as tp_size)
  uint32_t peer_dp_size = 1;     // the other engine's DP size (kvferry/routing.h)
  // KV geometry: global KV heads, head_dim and dtype decide the head slices this rank holds and
  // the transfer plan for unequal TP; page_size in tokens.
  ModelGeometry model;
  uint32_t page_size = 1;
  // The engine's buffers (kvferry/buffers.h; valid until the manager is destroyed): one KV buffer
  // per layer tensor of item_bytes = a page of this rank's heads, aux and state buffers; their
  // page count and aux rows become layout().num_pages and aux_slots (pool_bytes, pool_base and
  // aux_rows are then unused). Empty: one contiguous pool of pool_bytes laid out by kvferry
  // (PoolLayout, kvferry/geometry.h) with aux_rows aux slots: at pool_base if set (the engine owns
  // it, e.g. a numpy array; valid until the manager is destroyed), else kvferry allocates it.
  std::vector<BufferDesc> buffers;
  uint8_t* pool_base = nullptr;
  uint64_t pool_bytes = 0;
  uint32_t aux_rows = 1024;
  // Prefill: the bootstrap service ("host:port") it registers at (empty: it registers nowhere;
  // tests). Decode: the prefill instance's bootstrap service used by receiver(room) without one
  // (empty: none until a receiver names one); looked up by create() and kept for the manager's life.
  std::string bootstrap_address;
  // Decode: the most prefill instances served at once (looked up, or being looked up); a
  // receiver naming one more is refused (kResourceExhausted) until an idle one is forgotten.
  uint32_t max_prefill_instances = 64;
  // Decode: a prefill instance (other than bootstrap_address's) with no room for this long, whose
  // sources owe nothing (no quarantined room, no failure waiting to be told), is forgotten: its
  // heartbeats stop and a later receiver naming it looks it up again.
  int64_t prefill_instance_idle_ms = 60'000;
  // Prefill: the most decode instances (distinct decode engine_ids, self.engine_id of their
  // ranks) known at once; a pool registration from one more is refused (kResourceExhausted) and
  // nothing of it is kept (docs/manager.md "Several decode instances").
  uint32_t max_decode_instances = 64;
  // Prefill: a decode instance with no room bound to it, no rank connected (each declared dead
  // or never connected) and no frame from any of its ranks for this long is forgotten: its
  // registrations, incarnations and connections go and its slot is free. A live instance, which
  // heartbeats, is never forgotten.
  int64_t decode_instance_idle_ms = 60'000;
  // The control socket's bind and advertised host (port 0: any free port). Peers (the prefill's
  // bootstrap entry, decode's pool registration) are told the advertised host.
  ListenAddress control;
  // Transport name ("shm", "tcp") and its worker shards (1..kMaxTransportShards).
  std::string transport = "shm";
  uint32_t transfer_shards = 1;
  // TCP congestion control of the tcp transport's data sockets (TransportOptions::tcp_congestion;
  // empty: the host's default).
  std::string tcp_congestion = "cubic";
  Deadlines deadlines;
  // true: a progress thread pumps the rank. false: the caller pumps (wait_fds(), progress()).
  bool progress_thread = true;
  int64_t progress_interval_ms = 5;  // longest wait of the progress thread without an event
  // Wrap the transport in the fault-injecting decorator (tests, replay fault plans): faults().
  bool fault_injection = false;
  // End-to-end integrity (docs/failure-model.md "Integrity"; off by default). Decode: every room
  // asks its prefill sources for a digest of what they wrote (xxHash XXH3-64 per written row,
  // keyed by its destination offset, summed per source) and, once they all said Success,
  // computes it over what landed in the room's pages, aux, state and guard rows; a mismatch or a
  // missing digest fails the room (integrity_error, origin this rank). Prefill: digests are sent
  // to any decode rank that asks, whatever this flag; with it set, a room whose decode rank does
  // not ask fails (integrity_error, origin this rank), so an operator who turned it on on either
  // side never runs unverified rooms. Host memory only (kInvalidArgument with device buffers).
  bool integrity = false;
  // Non-empty: each failed room of a sender/receiver is logged once (kvferry/log.h) under this
  // component, at the level of the failure logging policy (docs/manager.md); empty: the caller
  // logs failures itself (the C++ drivers do, at release).
  std::string failure_log_component;
};

// Per-room transfer metrics (SGLang's get_transfer_metric: latency, alloc latency, bytes).
struct TransferMetrics {
  uint64_t bytes = 0;            // prefill: bytes written; decode: bytes expected
  int64_t created_ns = 0;        // sender()/receiver() returned
  int64_t metadata_ns = 0;       // prefill: every destination's metadata arrived; decode: sent
  int64_t first_send_ns = 0;     // prefill: first send()
  int64_t done_ns = 0;           // Success or Failed, whichever came first here
  int64_t failed_ns = 0;         // the room failed here (also after a Success: the engine failed it)
  double latency_s() const { return done_ns && first_send_ns ? (done_ns - first_send_ns) * 1e-9 : 0; }
  double wait_metadata_s() const { return metadata_ns ? (metadata_ns - created_ns) * 1e-9 : 0; }
};

class Sender {
 public:
  // Releases the room once drained (deferred, never blocks). A sender dropped before its room
  // ended (before init(), or before its last send() concluded the room) without a failure fails
  // its room first (aborted, origin this rank), so decode is told rather than waiting out its
  // waiting_timeout.
  virtual ~Sender() = default;
  virtual uint64_t room() const = 0;
  // The room has `num_pages` pages (it may have more than this rank's pool: the pages are sent
  // chunk by chunk from whatever local pages each send() names); `aux_index` is this rank's aux
  // row copied to decode's row of every aux buffer (ignored without aux buffers); `num_tokens`
  // (0: num_pages * page_size) goes into the guard row. May come before decode's metadata or after (SGLang: once poll() said
  // WaitingForInput); the room's bootstrap deadline counts from the sender's creation either way.
  // Errors: called twice, after the room failed (e.g. at its bootstrap deadline), num_pages 0,
  // aux_index out of range.
  virtual Status init(uint64_t num_pages, uint64_t aux_index, uint64_t num_tokens = 0) = 0;
  // Writes the next pages of the room from local pages `pages` (a chunk) to every destination.
  // `last`: this is the final chunk (it may carry zero pages; no other chunk may); `state_indices` (local state rows,
  // one per state buffer row the room uses) go with the last chunk only. Errors: before init,
  // after the last chunk, more pages than init said, an index out of range. On a room that
  // failed (also before init) every call is accepted and writes nothing.
  virtual Status send(std::span<const uint64_t> pages, std::span<const uint64_t> state_indices, bool last) = 0;
  // Layer-wise: the same for the KV buffers of `layers` only (kvferry/geometry.h LayerRange:
  // [begin, end) of the model's layers, 0-based; layer l is KV buffers l + t x num_layers, its K
  // and V; the default range is every layer, which is the form above). An engine sends each
  // layer (or group of layers) as its forward pass produces it, so the transfer overlaps compute:
  //   for l in 0..num_layers-1: s->send(pages, {l, l + 1}, {}, false);   then
  //   s->send({}, {}, state_indices, true);   // or the last layer's call with last = true
  // Each layer sends the room's pages in token order, chunk after chunk, as the form above does
  // for the whole room: a call writes the next pages.size() pages of every layer of the range,
  // which must all stand at the same page (otherwise send the layers separately). Page chunks and
  // layer ranges mix freely (e.g. chunked prefill: every chunk's pages once per layer).
  // `last` is the room's final call: after it every page of every layer has been sent (this call
  // included); it may carry zero pages; state_indices go with it only. The aux row, state rows and
  // guard row are written after every KV write of the room completed, so decode reaches Success
  // (and the prefill Success) only once every layer of every page landed; decode needs nothing
  // layer-wise. Units: pages as above, layers 0-based. Thread contract: as every Sender call.
  // Errors (kInvalidArgument, nothing is sent): those of the form above, and a range that is
  // empty or past the model's layers, layers of the range at different pages, a layer given more
  // pages than the room has, a `last` call that leaves a page of some layer unsent (named).
  virtual Status send(std::span<const uint64_t> pages, LayerRange layers, std::span<const uint64_t> state_indices,
                      bool last) = 0;
  // Before init(): Bootstrapping until every destination's metadata arrived (or a destination's
  // failure, or the rank has no destination), then WaitingForInput, so an engine may call init()
  // only once the decode side is ready (SGLang's order, docs/sglang.md). A poll of a room not yet
  // Success or Failed first takes in the control frames and write completions that already arrived
  // (at most once per 2 us for the whole manager), so an engine that polls often sees them without
  // waiting for the progress thread's wake-up; it never waits. Receiver::poll() does the same.
  virtual KVPoll poll() const = 0;
  virtual std::optional<KVTransferError> failure() const = 0;
  // The room's destinations: the decode ranks this rank writes the room to (the transfer plan of
  // the two engines' TP sizes and the room's decode DP group, kvferry/routing.h). Empty: this
  // rank's heads go to no decode rank (replicated heads, MLA non-source); its room concludes on
  // the last send without writing. Known from the sender's creation.
  virtual std::vector<RankId> peers() const = 0;
  // Fails the room here (code aborted, origin this rank) and tells every destination.
  virtual void abort(const std::string& reason) = 0;
  // The same with another code: a failure this rank observed itself (e.g. the engine refused to
  // go on with the room); the origin is this rank and the failure is local here. `observed_ns`:
  // when it observed it (CLOCK_MONOTONIC ns; 0: now), e.g. the step at which the engine's leader
  // decided it, so every rank that hears of it names the same instant. An instant in the future
  // or more than kMaxObservedAgeMs ago counts as now (the root-cause rule compares instants: a
  // made-up one must not win it).
  virtual void fail(ErrorCode code, const std::string& reason, int64_t observed_ns = 0) = 0;
  // A failure this rank learned from its engine (the engine's agreement, another rank's failure):
  // recorded as from another rank, told to the destinations. If the room already failed here, the
  // root-cause rule (kvferry/error.h) decides which record the room keeps.
  virtual void fail_from_engine(const KVTransferError& e) = 0;
  // The engine's agreement says the room failed (SGLang: the MIN of its TP group's polls), but
  // this rank saw no failure of it (no kvferry message about it reached this rank: e.g. in a 1:1
  // TP mapping, another rank's source failed). Returns the room's failure as every rank of both
  // engines names it: the record the rank that observed it posted to the failure board of the
  // room's bootstrap service (docs/failure-model.md "Agreement-only ranks"), asked for until it is
  // there or `wait_ms` passed (it usually is: the origin posts it as its room fails, before the
  // engine can agree). The room then fails here with that origin, code and reason,
  // is_from_another_rank, and this rank's peers are told. If the room already failed here: that
  // failure, unless the board holds a record that precedes it by the root-cause rule (another pair
  // of ranks failed the room independently), which the room then takes, as from another rank
  // (one look at the board, no wait). Without a record in time (no bootstrap service, a post lost), the room fails
  // with `fallback` as from another rank. Blocks the calling thread up to wait_ms (not the
  // manager: the lock is not held while it waits); after three waits in vain in a row (or one in
  // which the board never answered) the next calls for 10 s wait at most 25 ms.
  virtual KVTransferError fail_from_agreement(const KVTransferError& fallback, int64_t wait_ms) = 0;
  // No write of this room is in flight and its terminal status went out.
  virtual bool release_safe() const = 0;
  virtual TransferMetrics metrics() const = 0;
  // The per-chunk completion event. Each send() that returned OK has a number: 0, 1, 2 ... in call
  // order (both forms count). Returns, once each, the numbers of the sends whose KV writes have
  // all ended since the last call: completed at every destination (landed, or failed: the room
  // then fails), or given up at the room's drain deadline. A send of zero pages (the last may
  // carry none) and a send on a room that had already failed end at once. Once a send's number
  // came back the engine may reuse its source pages (a staging ring: the chunk's pages): no write
  // of it reads them any more, except one given up at the drain deadline, which can land only in
  // pages decode keeps quarantined (Receiver::quarantined()). The room's aux row and state rows
  // (init()'s aux_index, the last send's state_indices) are not part of any send's pages: the
  // room's final batch reads them after every KV write completed, so keep them until the room
  // ends (Success, or Failed and release_safe()). Wake-ups: the manager's progress (wait_fds()
  // with a caller-pumped manager). Thread contract: as every Sender call.
  virtual std::vector<uint64_t> take_completed_sends() = 0;
};

// fail(code, reason, observed_ns): the oldest observation instant taken as given.
inline constexpr int64_t kMaxObservedAgeMs = 60'000;

class Receiver {
 public:
  // Releases the room once release-safe (deferred). A receiver dropped before its room ended
  // (Success or Failed) fails it first (aborted, origin this rank), so every source stops and is
  // told; its pages, aux and state rows may still take a write until Manager::take_reclaimed_rooms()
  // names the room: keep them until then (or drop a receiver only once release_safe()).
  virtual ~Receiver() = default;
  virtual uint64_t room() const = 0;
  // Which DP group of the prefill engine serves the room (SGLang's init(prefill_dp_rank));
  // -1: dp_rank_for_room(room, peer_dp_size).
  virtual Status init(int64_t prefill_dp_rank = -1) = 0;
  // Destination pages (one per room page, in token order), aux row and state rows; sent to every
  // prefill source of the room. Errors: out-of-range or duplicate pages, bad aux/state rows.
  virtual Status send_metadata(std::span<const uint64_t> pages, uint64_t aux_index,
                               std::span<const uint64_t> state_indices, uint64_t num_tokens = 0) = 0;
  // abort()/fail()/fail_from_engine() after init() and before send_metadata() (e.g. the request was
  // aborted while it waited for memory) tell every prefill source of the room at once, so prefill
  // fails it now with this cause rather than at its bootstrap deadline. Before init() the failure
  // stays on this rank (no source is known yet).
  virtual KVPoll poll() const = 0;
  virtual std::optional<KVTransferError> failure() const = 0;
  // The room's prefill sources: the prefill ranks whose writes land in this rank's pages (the
  // transfer plan and the DP group init() chose). Empty before init().
  virtual std::vector<RankId> peers() const = 0;
  virtual void abort(const std::string& reason) = 0;
  virtual void fail(ErrorCode code, const std::string& reason, int64_t observed_ns = 0) = 0;  // as Sender::fail
  virtual void fail_from_engine(const KVTransferError& e) = 0;
  virtual KVTransferError fail_from_agreement(const KVTransferError& fallback, int64_t wait_ms) = 0;  // as Sender's
  // True once no write of any prefill source can reach the room's pages, aux and state rows.
  virtual bool release_safe() const = 0;
  // True if release_safe() only because the drain deadline passed: the pages must be quarantined.
  virtual bool quarantined() const = 0;
  virtual TransferMetrics metrics() const = 0;
};

struct ManagerStats {
  uint64_t live_rooms = 0;         // rooms of senders/receivers, dropped ones until released
  uint64_t peers = 0;              // peer ranks of the other engine known to this rank
  uint64_t quarantined_rooms = 0;  // decode: rooms released quarantined, so far
  uint64_t quarantined_pages = 0;  // decode: their pages and rows not reclaimed yet (leaked now)
  uint64_t reclaimed_rooms = 0;    // decode: quarantined rooms reclaimed, so far
  uint64_t failure_records = 0;    // rooms with a failure record held (released rooms drop theirs)
  uint64_t aux_rows_in_use = 0;    // prefill with the contiguous pool: guard rows kvferry stages
  // Incarnations (docs/failure-model.md "Incarnations"): frames refused as from a peer's earlier
  // process, by kind, and peer restarts seen, so far.
  uint64_t stale_registrations = 0;
  uint64_t stale_metadata = 0;
  uint64_t stale_statuses = 0;
  uint64_t stale_heartbeats = 0;
  uint64_t peer_restarts = 0;
  // Frames refused from peers, by kind (docs/security.md names; "foreign": frames about rooms
  // that are not the sender's), so far. Every kind is listed, zeros included.
  std::vector<std::pair<std::string, uint64_t>> refusals;
  TransportStats transport;
  // The control plane's cost so far (docs/BENCHMARKS.md "Control plane"): frames and bytes through
  // this rank's control socket (sent: room messages, registrations, answers; received: those and
  // every peer's heartbeats), and heartbeat frames this rank sent (one per watched peer per
  // heartbeat_interval, from each of its peer monitors).
  uint64_t control_frames_sent = 0, control_bytes_sent = 0;
  uint64_t control_frames_received = 0, control_bytes_received = 0;
  uint64_t heartbeats_sent = 0;
  // Decode: per prefill instance served (by bootstrap address, in address order).
  struct PrefillInstance {
    std::string bootstrap;
    uint64_t rooms = 0;              // receivers' rooms naming it, dropped ones until released
    uint64_t peers = 0;              // its source ranks known to this rank
    uint64_t dead_peers = 0;         // of those, declared dead and not back yet
    uint64_t quarantined_rooms = 0;  // released quarantined, not reclaimed yet
    uint64_t quarantined_pages = 0;
  };
  std::vector<PrefillInstance> prefill_instances;
  uint64_t forgotten_prefill_instances = 0;  // decode: forgotten idle, so far
  uint64_t decode_instances = 0;             // prefill: decode instances (engine_ids) known now
  uint64_t forgotten_decode_instances = 0;   // prefill: forgotten idle (or left), so far
  bool leaving = false;                      // Manager::leave() was called
};

class FaultInjectingTransport;

class Manager {
 public:
  // Builds the rank: registers its memory with the transport, binds the control socket, starts
  // heartbeats; prefill registers at its bootstrap service (retrying up to lookup_timeout_ms);
  // decode with a bootstrap_address looks that prefill instance up and registers its pool there
  // (blocking up to lookup_timeout_ms). Errors: kInvalidArgument (bad geometry, pool, transport
  // name or shards, naming the value), kPeerUnreachable / kBootstrapTimeout (bootstrap service),
  // kInternal (UCX or ZeroMQ could not start).
  static Result<std::unique_ptr<Manager>> create(const ManagerConfig& config);
  virtual ~Manager() = default;  // stops the progress thread; the transport goes first

  // Prefill only. Errors (kInvalidArgument): a sender for the room exists (or its room is still
  // being released), or this is a decode manager. Room ids are not to be reused (SGLang draws
  // them at random from 2^63): a released failed room's id is remembered for up to 120 s, and a
  // decode rank's late metadata for it is answered with that failure.
  virtual Result<std::unique_ptr<Sender>> sender(uint64_t room) = 0;
  // Decode only. `prefill_bootstrap` ("host:port"; empty: config.bootstrap_address) names the
  // prefill instance serving the room: any number of instances (up to
  // config.max_prefill_instances), each looked up and connected on the first receiver naming it
  // (this call then blocks up to lookup_timeout_ms, without holding up the other instances'
  // rooms; concurrent calls naming it wait for that one lookup) and kept while it has rooms
  // (docs/manager.md "Several prefill instances"). Heartbeats, peer deaths, restarts, quarantine
  // and the compatibility check are per instance: a dead or incompatible instance fails its own
  // rooms only. Errors: as create() for the lookup (the calls waiting for a failed lookup all get
  // its error; the next call naming the address looks it up again); kResourceExhausted past
  // max_prefill_instances; kInvalidArgument for a live receiver of the room, a prefill manager,
  // no address at all.
  virtual Result<std::unique_ptr<Receiver>> receiver(uint64_t room, const std::string& prefill_bootstrap = "") = 0;

  // An orderly leave, its first half (docs/failure-model.md "Leaving"; the second is the
  // destructor): the engine is being drained and removed. From this call on, sender() and
  // receiver() are refused (kInvalidArgument "... is leaving"), also a receiver() whose lookup was
  // under way; rooms already handed out go on to their end as before (every byte, their failures
  // as before). Prefill: metadata of a room this rank has no sender for (held, or arriving later)
  // is answered with a terminal failure (kAborted, origin this rank, "... is leaving"), so such a
  // room fails at decode at once; once no room is live, this rank's bootstrap entry is removed
  // (BootstrapClient::deregister at this process's incarnation; one try bounded by `timeout_ms`,
  // without the manager's lock): by this call when no room is live now, else by a thread of the
  // manager when the last one ends, so a decode rank that looks the instance up for a room in
  // flight still finds it. After the removal a lookup fails at once (kPeerUnreachable "... left")
  // instead of waiting out lookup_timeout_ms. Returns the removal's status when this call made it
  // (ok otherwise: no bootstrap service, a decode manager, or the removal deferred); a later call
  // after a failed removal tries again. Then poll drained(), and destroy the manager once it is
  // true: the destructor sends the leaving heartbeat, and the peers forget this rank without a
  // failure and without a line above info.
  virtual Status leave(int64_t timeout_ms = 2000) = 0;
  // True once leave() was called, no room is live any more (every Sender/Receiver handed out was
  // dropped and its room released: ManagerStats::live_rooms is 0), no receiver() call is in its
  // lookup, and (prefill with a bootstrap service) the removal of its entry was tried.
  virtual bool drained() const = 0;

  // Caller-pumped managers (progress_thread false): fds to wait on (readable: call progress()),
  // and one round of progress (control frames, transport completions, deadlines, heartbeats,
  // releases of dropped handles). Never blocks. With a progress thread: wait_fds() is empty and
  // progress() is a no-op.
  virtual std::vector<int> wait_fds() const = 0;
  virtual void progress() = 0;

  virtual const RankId& self() const = 0;
  virtual const PoolLayout& layout() const = 0;  // heads of this rank, page size, pages, aux slots
  // The contiguous pool laid out as layout() (kvferry's, or config.pool_base): where the engine
  // reads and writes page i of buffer b (layout().page_offset(b, i)). Null with engine buffers.
  virtual uint8_t* pool_base() const = 0;
  virtual std::string control_endpoint() const = 0;  // advertised ("tcp://host:port")
  virtual ManagerStats stats() const = 0;
  // Decode: rooms released quarantined (Receiver::quarantined()) whose prefill sources have since
  // confirmed the drain (or died), and rooms whose receiver was dropped before it was
  // release-safe, once they are, since the last call: their pages, aux and state rows may be
  // reused now. Prefill: always empty.
  virtual std::vector<uint64_t> take_reclaimed_rooms() = 0;
  // The fault decorator (config.fault_injection), else nullptr.
  virtual FaultInjectingTransport* faults() = 0;
};

}  // namespace kvferry
