// PrefillEndpoint: the prefill side of the manager: decode pool registrations (peers), one
// sender per room, chunked writes, aux last, terminal status to every destination.
// Per room (KVSender semantics, SGLang-style): Bootstrapping until every expected decode rank's
// metadata came, WaitingForInput until the first send(), Transferring until every chunk (the last
// may carry no page) and the final batch were written and flushed, Success once its status went
// out. The final batch, one transport write per destination after its last KV write completed: this
// rank's aux row (aux_index) into the decode's row of every aux buffer, the state rows (local
// state_indices[j] into the decode's state_indices[j] of every state buffer), and kvferry's guard
// row (the AuxRecord: room, tokens, pages) into the decode's guard row; only the lowest source of a
// decode rank writes it (topology.h). A failure (local, or learned from a peer or from the engine's
// agreement) makes it Failed. If writes of the room are in flight then, a non-terminal Failed
// status (RoomStatus::terminal false) with the root cause goes to every destination at once, so
// decode fails the room without waiting for them; once no write of the room is in flight the
// terminal Failed status follows, which is decode's signal that its pages are no longer written
// ("drained"). Metadata or failures for a room not added yet are kept (bounded, TTL) until it is;
// anything for a released room is answered with its failure, never revives it.
// Thread contract: main thread only.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "endpoint/core.h"
#include "kvferry/state.h"
#include "endpoint/page_allocator.h"
#include "endpoint/refusals.h"
#include "endpoint/topology.h"

namespace kvferry {

struct DecodePeer {
  PoolRegistration reg;
  MemoryShape shape;  // where the peer's buffers are in its offset space (from reg)
  PeerId peer = 0;
};

// The shape a registration declares.
MemoryShape shape_of(const PoolRegistration& r);

struct SenderRoom {
  uint64_t room = 0;
  uint64_t input_tokens = 0;
  uint64_t total_pages = 0;
  RoomState state;
  // The decode instance (engine_id) the room is bound to: that of its first accepted metadata or
  // renewal (prefill_instances.cc). dests are that instance's ranks the plan sends to; they stay
  // empty until the room is bound. `planned`: the plan gives this rank destinations (false: the
  // room has none and needs no instance: replicated heads, MLA non-source).
  std::optional<uint32_t> engine;
  bool planned = false;
  std::vector<RankId> dests;
  std::map<RankId, RoomMetadata> meta;
  // Per layer, pages handed to send() (layer-wise sends: kvferry/geometry.h LayerRange); a page
  // of a layer counts as one unit, so the room's KV is total_pages x num_layers units.
  std::vector<uint64_t> layer_pages;
  uint64_t units_done = 0;       // units (page x layer) whose writes completed at every destination
  uint32_t inflight = 0;         // write batches in flight (chunks x destinations, aux)
  bool aux_submitted = false;      // the final batch (aux rows, state rows, guard row) went out
  bool final_in_chunk = false;     // ... behind the last chunk's KV writes (prefill_final.cc)
  bool last_received = false;      // send() with last: no more chunks
  std::optional<uint64_t> aux_index;  // this rank's aux row (init's aux_index), if given
  std::vector<uint64_t> state_indices;  // this rank's state rows, given with the last chunk
  bool terminal_sent = false;
  bool early_failure_sent = false;  // the non-terminal Failed went out (writes were in flight)
  // Destinations whose failure status reached us. A failed room is drained only once every
  // destination that sent metadata told us its failure (or died, or the drain deadline passed),
  // so the engine knows every rank's root-cause candidate before it releases the room
  // (docs/failure-model.md, "Across engines").
  std::set<RankId> failure_heard;
  int64_t created_ns = 0;
  int64_t bootstrap_deadline_ns = 0;  // Bootstrapping past this fails with bootstrap_timeout
  uint64_t renewals = 0;              // renewals by a destination that moved the deadline (on_renewal)
  int64_t first_send_ns = 0;
  int64_t failed_ns = 0;
  // Last submission or completion of a write of the room: Transferring with writes in flight and
  // no completion for transfer_timeout_ms fails the room (prefill_deadlines.cc).
  int64_t progress_ns = 0;
  // Failed, and its writes still in flight drain_timeout_ms after the failure: they are given up
  // (their chunks are done for the driver, the room may be released), but no terminal status goes
  // out until they complete, so decode keeps its pages quarantined until then.
  bool abandoned = false;
  uint64_t bytes = 0;
  std::optional<uint64_t> aux_staging;  // guard row allocated to stage the record (no aux_index)
  // Per destination whose metadata asked for it (RoomMetadata::integrity): the digest of what was
  // written to it so far (endpoint/integrity.h), sent with Success.
  std::map<RankId, uint64_t> digests;
};

// A chunk's writes finished (all destinations); the driver frees its staging pages.
struct ChunkDone {
  uint64_t room = 0;
  uint64_t tag = 0;
  bool ok = false;
};

class PrefillEndpoint {
 public:
  // `plan`: which heads this engine's ranks write to which decode ranks (topology.h).
  // `decode_dp`: the decode engine's DP size; a room is served by decode DP rank
  // dp_rank_for_room(room, decode_dp) (kvferry/routing.h).
  PrefillEndpoint(EndpointCore& core, std::vector<HeadTransfer> plan, uint32_t decode_dp = 1);

  void on_message(const Message& m);
  // Consumes a transport completion; returns the chunk that completed, if any.
  std::optional<ChunkDone> on_transport_event(const TransportEvent& e);

  void add_room(uint64_t room, uint64_t input_tokens) { (void)add_room(room, input_tokens, std::nullopt); }
  // A room with this rank's aux row `aux_index` (the sender's init): copied into the decode's row
  // of every aux buffer, and this rank's guard row `aux_index` stages the guard record. Without it
  // (nullopt) the guard record is staged in a guard row kvferry picks, and the rank must have no
  // aux buffers (send() refuses). A rank uses one way or the other for all its rooms.
  // Errors: aux_index out of range (no room is added then). A room that exists is left as it is.
  Status add_room(uint64_t room, uint64_t input_tokens, std::optional<uint64_t> aux_index);
  // A room that failed before its sender's init() (src/manager/manager.cc open_sender_for_failure):
  // added without pages and failed with `f` before any metadata is applied, so every destination's
  // metadata, kept or still to come, is answered with the failure. A room that exists just fails.
  void add_failed_room(uint64_t room, const Failure& f, bool observed_here);
  bool has_room(uint64_t room) const { return rooms_.count(room) != 0; }
  const SenderRoom* room(uint64_t room) const;
  KVPoll poll(uint64_t room) const;
  // A room not added yet: every destination's metadata (or a failure from one) arrived, or this
  // rank has no destination for it. What a sender reports before init() (SGLang's prefill calls
  // init only once its sender is WaitingForInput; docs/sglang.md).
  bool metadata_complete(uint64_t room) const;
  // A room not added yet: a destination of it that is dead now (declared dead and not back), if
  // any. The manager fails such a sender before init() (its metadata can no longer come).
  std::optional<RankId> dead_destination(uint64_t room) const;
  // Rooms not added yet whose senders exist (the manager's, before init()): on a destination's
  // death, on_peer_dead calls the hook (the dead rank, the failure's reason, its instant), which
  // fails those bound for it (add_failed_room) and returns them; the death's warning names them.
  using UnopenedHook = std::function<std::vector<uint64_t>(const RankId&, const std::string&, int64_t)>;
  void set_unopened_rooms_hook(UnopenedHook hook) { unopened_hook_ = std::move(hook); }
  // A destination's failure of a room not added yet (its sender exists but was not init()ed):
  // on_status calls the hook, which opens the room failed with it (add_failed_room) and returns
  // true, so the engine's next poll says Failed rather than WaitingForInput (no prefill forward
  // for a request decode already gave up). False: no such sender; the failure waits for add_room.
  using UnopenedFailureHook = std::function<bool(uint64_t room, const Failure& f)>;
  void set_unopened_failure_hook(UnopenedFailureHook hook) { unopened_failure_hook_ = std::move(hook); }

  // Writes the room's pages [first_page, first_page + src_pages.size()) from the local pages
  // `src_pages` to every destination. `tag` (> 0, unique) comes back in ChunkDone once the
  // chunk's writes completed at every destination (at once for a room without destinations; a
  // chunk without pages has no ChunkDone). `last`: no chunk follows (it may carry no page; the
  // room's pages must all have been sent then); `state_indices` (this rank's state rows, one per
  // row the room uses, the decode gives as many) go with the last chunk only. After the last
  // chunk's writes the final batch goes out (see above); a room without destinations (replicated
  // heads, MLA non-source) concludes Success on the last chunk.
  // Errors (nothing is written then): the room is not WaitingForInput/Transferring, a chunk after
  // the last, pages past the room's page count, a local page or state row out of range, state
  // indices before the last chunk, a last chunk that leaves pages unsent, aux buffers but no
  // aux_index.
  // `layers`: only the KV buffers of these layers (default: every layer). A room's pages may go
  // as several layer ranges and page chunks; each layer counts its own pages, and `last` needs
  // every page of every layer sent (this call included). Errors besides the above: a layer range
  // empty or past the model, a layer given more pages than the room has.
  Status send(uint64_t room, uint64_t first_page, const std::vector<uint64_t>& src_pages, uint64_t tag,
              std::span<const uint64_t> state_indices, bool last, LayerRange layers = {});
  // The form before chunks carried `last`: the chunk holding the room's final page is the last.
  Status send(uint64_t room, uint64_t first_page, const std::vector<uint64_t>& src_pages, uint64_t tag);

  // A rank that writes nothing for this room (replicated heads, MLA non-sender) concludes it:
  // Success without writing. Errors: the room has destinations, or is not WaitingForInput.
  Status conclude_without_writing(uint64_t room);

  // Records a failure (local when origin == self) and makes the room Failed. `via`: the rank whose
  // message told this rank (logged as "via"; `kvferry logs` orders by it).
  void fail(uint64_t room, ErrorCode code, const std::string& reason, const RankId& origin,
            int64_t first_seen_ns, bool observed_here, const RankId* via = nullptr);
  // The same with the failure record as it arrived (keeps its wall_ns).
  void fail(uint64_t room, const Failure& f, bool observed_here, const RankId* via = nullptr);
  // Overrides the room's bootstrap deadline (replay's timeout faults).
  void set_bootstrap_deadline(uint64_t room, int64_t deadline_ns);
  // No write of the room is in flight and the terminal status went out.
  bool drained(uint64_t room) const;
  void release(uint64_t room);

  // Periodic work: deadlines, terminal statuses of drained failed rooms, expiry of pending frames.
  void tick(int64_t now_ns);
  // Chunks of abandoned rooms (SenderRoom::abandoned), done with ok false since the last call:
  // their staging pages may be reused (a late write of them lands only in pages decode keeps
  // quarantined). Their late completions produce no second ChunkDone.
  std::vector<ChunkDone> take_abandoned_chunks() { return std::exchange(abandoned_chunks_, {}); }
  // Writes given up so far (abandoned while in flight), and those of them that completed later
  // (decode was then told the room's pages are no longer written: the terminal status).
  uint64_t abandoned_writes() const { return abandoned_writes_; }
  uint64_t abandoned_writes_completed() const { return abandoned_completed_; }
  // Released abandoned rooms whose writes are still in flight (capped at kMaxAbandonedRooms).
  size_t abandoned_rooms() const { return abandoned_.size(); }
  static constexpr size_t kMaxAbandonedRooms = 4096;

  // A decode peer is dead (heartbeats stopped, or the transport failed its endpoint): every room
  // bound for it fails with origin = the peer and code peer_unreachable; one line above debug.
  // A peer that said it is leaving (Heartbeat::leaving) and has not been heard since: its loss
  // with no room failed is one info line.
  void on_peer_dead(const RankId& peer, const std::string& reason);
  // The transport failed its endpoint to `peer` (`reason`: its error). Not a death verdict by
  // itself (docs/failure-model.md, "A transport error is only a suspicion"): UCX's tcp transport
  // reports every socket failure as "Endpoint timeout", and a process whose control endpoint
  // still accepts connections is alive. A probe that is refused (the process is gone) or gets no
  // answer (a silent network) makes it on_peer_dead() at once; one that accepts makes the link a
  // suspect for up to kLinkVerdictMs (probed again every PeerMonitor::kProbeIntervalMs): a
  // refusal within it is still the peer's death (its sockets close a moment apart), otherwise
  // on_link_lost(). Idempotent per peer endpoint (the batches failed with it come one by one).
  void on_transport_lost(const RankId& peer, const std::string& reason, int64_t now_ns);
  static constexpr int64_t kLinkVerdictMs = 200;
  // Transport links lost to a live peer and connected again (on_link_lost), so far.
  uint64_t links_lost() const { return links_lost_; }

  // Tombstone caps (oldest dropped first), also aged out after 120 s. Memory: ~80 bytes per
  // tombstone (map node, bucket, FIFO entry) plus the cause of a failed room (a few hundred bytes
  // with its reason): under 1 MiB at the caps, whatever the number of rooms served.
  // Why dropping the oldest is safe: a frame for a room whose tombstone is gone is handled like a
  // frame for a room not added yet: kept at most kPendingTtlNs (120 s) and applied only if a room
  // with that id is added within that time. Room ids are not reused (SGLang and kvferry's router
  // draw bootstrap_room at random from 2^63; the bench numbers rooms upward), and the registry
  // drops records for rooms that are not open, so it never attaches to another room.
  // What the caps trade: late metadata for a failed room that fell out of the failed FIFO is not
  // answered with its cause; decode then fails that room by its own waiting_timeout. A succeeded
  // room can only get frames that were already in flight when it succeeded (decode's timeout
  // racing prefill's Success), so a short history suffices: 1024 rooms = 0.5 s at 2000 rooms/s.
  static constexpr size_t kMaxOkTombstones = 1024;
  // Frames kept for rooms not added yet: at most this many rooms, and one metadata per sender
  // (at most kMaxPendingSenders) for each; more are dropped (the sender asks again).
  static constexpr size_t kMaxPendingRooms = 1u << 16;
  static constexpr size_t kMaxPendingSenders = 64;
  // The same per sender, so that one peer's flood cannot crowd out another's metadata, and in page
  // and state indices (8 bytes each; a metadata may carry up to kMaxKvIndices): a sender keeps at
  // most kMaxPendingPerSender rooms and, beyond its first one, kMaxPendingIndicesPerSender
  // indices; all senders together at most kMaxPendingIndices (128 MiB). Dropped ones are counted.
  static constexpr size_t kMaxPendingPerSender = kMaxPendingRooms / 4;
  static constexpr uint64_t kMaxPendingIndicesPerSender = 1u << 22;
  static constexpr uint64_t kMaxPendingIndices = 1u << 24;
  size_t pending_metadata() const { return pending_entries_; }    // kept for rooms not added yet
  uint64_t pending_indices() const { return pending_indices_; }   // their page and state indices
  uint64_t dropped_pending() const { return dropped_pending_; }   // metadata dropped by the caps
  static constexpr size_t kMaxFailedTombstones = 2048;

  // Rooms whose first failure cause was recorded (fail()) since the last call, in order; a room
  // released before the call is left out (so the list stays bounded by the live rooms).
  std::vector<uint64_t> take_fresh_failures() { return std::exchange(fresh_failures_, {}); }

  size_t live_rooms() const { return rooms_.size(); }
  // Manager::leave(): metadata of a room without a sender (`coming`: made, not init()ed), answered Failed.
  void leaving(std::set<uint64_t> coming);
  size_t tombstones() const { return tombstones_.size(); }  // released rooms remembered (capped)
  // Decode ranks registered here: connected, or with their connect under way.
  size_t peers() const {
    size_t n = peers_.size();
    for (const auto& [rank, c] : connecting_) n += peers_.count(rank) ? 0 : 1;
    return n;
  }
  // Connected and not being connected again (a restarted rank's new connect).
  size_t connected_peers() const {
    size_t n = 0;
    for (const auto& [rank, p] : peers_) n += connecting_.count(rank) ? 0 : 1;
    return n;
  }
  size_t connecting_peers() const { return connecting_.size(); }
  // The transport peer of a connected decode rank (nullopt: not connected), for tests.
  std::optional<PeerId> transport_peer(const RankId& d) const {
    auto it = peers_.find(d);
    if (it == peers_.end()) return std::nullopt;
    return it->second.peer;
  }
  // Pool registrations refused (check_registration) and the last reason, for tests and metrics.
  uint64_t refused_registrations() const { return refused_registrations_; }
  // Statuses and metadata refused because their sender is not a destination of the room they
  // name (another decode rank, another DP group): for tests and metrics.
  uint64_t foreign_messages() const { return foreign_messages_; }
  const std::string& last_refusal() const { return last_refusal_; }
  // Why `r` cannot be used with this rank's shape and transfer plan ("" when it can): sender not a
  // decode rank, page_size, number of KV buffers, aux or state item_bytes differing from ours,
  // page_bytes not page_size x its heads, heads outside the model or not covering what the plan
  // sends it, buffers outside the registered spans (overflow-safe).
  std::string check_registration(const PoolRegistration& r) const;
  // Whether `sender` is a destination of this rank in the agreed plan (a decode rank of any
  // engine_id, i.e. of any decode instance: a TP rank the plan sends to, a DP rank below the
  // decode engine's DP size). admits() counts and
  // logs a refusal (Refusal::kOutsidePlan); the manager asks it before decoding a frame
  // (kvferry::frame_sender) and on_message() again.
  bool in_plan(const RankId& sender) const;
  bool admits(const RankId& sender);
  // A PoolRegistration frame's compatibility fingerprint (kvferry/compat.h), read and compared
  // before anything else of the frame is decoded or used (prefill_registration.cc): false when it
  // differs from this rank's (the frame is then refused: one error line per decode incarnation,
  // a RegistrationRefusal with code incompatible_peer, and the rooms bound for it fail with that
  // record); true for every other frame, including a malformed fingerprint (decode() refuses it).
  bool admits_compat(std::string_view frame);
  // A room bound for a decode rank refused as incompatible fails at once with that record.
  bool fail_if_incompatible(uint64_t room);
  // The record of a destination of `room` (by the plan) refused as incompatible, if any: a sender
  // not init()ed yet fails with it at once (the manager's sender()).
  std::optional<Failure> incompatible_destination(uint64_t room) const;
  // Counts the decode ranks refused as incompatible so far (the manager then fails its senders
  // not init()ed yet that are bound for one).
  uint64_t incompatible_refusals() const { return incompatible_refusals_; }
  // Identities kept in the per-identity maps (peers, registrations, incarnations, connects): the
  // plan bounds them; this caps them whatever the plan (a new identity beyond it is refused).
  static constexpr size_t kMaxPeerIdentities = 4096;
  // Registrations claiming a restart that could not be confirmed yet (their old incarnation still
  // answers at its control endpoint), believed once it is gone (docs/security.md).
  size_t pending_restarts() const { return pending_restarts_.size(); }
  uint64_t aux_in_use() const { return aux_alloc_.in_use(); }

  // Several decode instances (prefill_instances.cc; docs/manager.md "Several decode instances"):
  // each decode engine_id is one, each of its ranks its own peer; a room is bound to the instance
  // of its first accepted metadata (or renewal), another's frames for it are refused (foreign).
  size_t decode_instances() const { return instances_.size(); }
  uint64_t forgotten_decode_instances() const { return forgotten_instances_; }
  // The instance `room` is bound to (a live or released room's; a room not added yet: its first kept metadata's).
  std::optional<uint32_t> bound_engine(uint64_t room) const;
  // bound_engine(), else the only decode instance known (with one instance, a room not bound yet
  // can only be its: its death or incompatibility fails the room, as before instances).
  std::optional<uint32_t> presumed_engine(uint64_t room) const;
  // The ranks of instance `engine` this rank writes `room` to (the plan, the room's DP group).
  std::vector<RankId> dests_for(uint64_t room, uint32_t engine) const;
  std::vector<RankId> destinations(uint64_t room) const;  // its instance's (bound, presumed), or none yet

 private:
  struct ChunkState {
    uint64_t room;
    uint32_t remaining;
    bool ok;
    uint64_t units;  // pages x layers of the chunk
  };
  void on_registration(const PoolRegistration& r);
  // prefill_instances.cc: the decode instances known here.
  struct DecodeInstance {
    int64_t last_ns = 0;  // the last frame from any of its ranks (or its admission)
  };
  std::map<uint32_t, DecodeInstance> instances_;
  uint64_t forgotten_instances_ = 0;
  // Whether `r` may add its instance (known, or under the bound); false: refused, nothing kept.
  bool admit_instance(const PoolRegistration& r, int64_t now_ns);
  void touch_instance(const RankId& sender, int64_t now_ns);
  bool known_instance(uint32_t engine) const;  // in instances_, or a rank of it in refused_
  std::optional<uint32_t> sole_instance() const;  // the only one known_instance() knows, if one
  void forget_idle_instances(int64_t now_ns);
  void forget_instance(uint32_t engine);
  // Binds `r` to instance `engine` (its dests); a destination down or refused as incompatible
  // fails it as add_room did. False: the room failed.
  bool bind(SenderRoom& r, uint32_t engine);
  std::vector<RankId> dests_or_presumed(const SenderRoom& r) const;  // r.dests, or sole_instance()'s
  // The incarnation checks of a registration (prefill_registration.cc): false when it is refused
  // (counted and logged here; nothing changed but a held restart claim). Sets *restart when it is
  // a confirmed restart of a known peer: peer_incarnation ours, incarnation within
  // kMaxIncarnationSkewNs of our clock, not older than the known one, the same pool as any other
  // registration of its incarnation, and a newer one only once the old incarnation is gone.
  bool accept_registration(const PoolRegistration& r, bool* restart);
  // prefill_restarts.cc (docs/security.md, "Incarnations"). A registration `r` claiming a restart
  // of a known peer whose known registration is `old`: whether it is confirmed. Confirmed: the
  // incarnation answered a challenge at old's control endpoint (or was confirmed so already); or
  // it names another endpoint and old's endpoint is gone (old_endpoint_gone()). Else it is held
  // (the newest per identity) and old's endpoint is challenged, at most once per heartbeat
  // interval; the answer confirms it (its incarnation) or drops it (the known one answered).
  bool restart_confirmed(const PoolRegistration& r, const PoolRegistration& old);
  void hold_restart_claim(const PoolRegistration& r, const std::string& old_endpoint, int64_t now_ns);
  // Heartbeats carrying a challenge or an answer (kvferry/messages.h): a challenge from a known
  // decode rank is answered at its registered control endpoint (rate-limited); an answer settles
  // the held claim whose nonce it echoes.
  void answer_challenge(const Heartbeat& hb);
  void on_challenge_answer(const Heartbeat& hb);
  // Each tick: a held claim confirmed since is taken (on_registration); the others challenged.
  void judge_restart_claims(int64_t now_ns);
  // Whether a refused registration may be answered (a RegistrationRefusal, or the heartbeat of
  // this incarnation): over the existing connection to its known endpoint, or once per identity at
  // the endpoint it names when the identity is not known here; rate-limited.
  bool may_answer(const PoolRegistration& r);
  // The registration kept for `peer` under `inc` (connecting, connected or down), if any.
  const PoolRegistration* registration_under(const RankId& peer, uint64_t inc) const;
  // Incarnations (kvferry/messages.h; prefill_registration.cc): whether a `kind` message from
  // `sender` with these incarnations may be used. Refused and counted: meant for another
  // incarnation of this rank (peer_inc not 0 and not ours), or from an incarnation of `sender`
  // older than the one it registered with. A newer one is the peer's restart (on_peer_restart);
  // that message is dropped unless it is the new incarnation's registration.
  bool accept_incarnation(const RankId& sender, uint64_t inc, uint64_t peer_inc, std::string_view kind);
  // The newest incarnation of a decode rank that registered here (0: none).
  uint64_t known_incarnation(const RankId& peer) const;
  // `peer` came back as incarnation `inc`: the rooms that involved its previous incarnation fail
  // as for its death (on_peer_dead, origin the peer).
  void on_peer_restart(const RankId& peer, uint64_t inc);
  // Tells a refused decode rank why (RegistrationRefusal), once per refused registration, and
  // keeps the record: its metadata fails the room with it (prefill_registration.cc).
  void refuse(const PoolRegistration& r, const std::string& why, ErrorCode code = ErrorCode::kProtocolError);
  // prefill_registration.cc: the transport connect to a registered decode rank runs off the main
  // thread (core.connector()); rooms for it wait (Bootstrapping) until it completes, and fail with
  // peer_unreachable, origin that rank, if it fails or passes connect_timeout_ms.
  void start_connect(const PoolRegistration& r, RemoteRegionInfo info);
  void check_connects(int64_t now_ns);
  void connect_failed(const RankId& peer, const PoolRegistration& reg, const std::string& why);
  // The registration metadata from `d` is checked against: the newest (connecting, else connected).
  const PoolRegistration* registration_for(const RankId& d) const;
  // Where to send `d` a status: its newest registration's control endpoint, also while it is
  // connecting or down (null: it never registered).
  const std::string* control_endpoint_of(const RankId& d) const;
  // The incarnation of `d`'s newest registration (kvferry/messages.h; 0: none): a status to it
  // carries it as peer_incarnation.
  uint64_t incarnation_of(const RankId& d) const {
    const PoolRegistration* reg = registration_for(d);
    return reg ? reg->incarnation : 0;
  }
  // Bootstrapping -> WaitingForInput once every destination's metadata came and every
  // destination is connected.
  void maybe_ready(SenderRoom& r);
  void on_metadata(const RoomMetadata& md);
  void on_status(const RoomStatus& st);
  // A decode rank renews rooms it awaits (Heartbeat::renew_rooms, prefill_renewal.cc): each room
  // this rank holds in Bootstrapping whose destination the sender is gets its bootstrap deadline
  // moved to bootstrap_timeout from now, at most renew_limit after its opening. Unknown or
  // released rooms are skipped (a renewal racing the room's end); a sender that is no destination
  // of the room is refused (counted as foreign, from_destination); neither changes the room.
  void on_renewal(const Heartbeat& hb, int64_t now_ns);
  void apply_metadata(SenderRoom& r, const RoomMetadata& md);
  // A destination sent its metadata again (a lost status): the status it is owed, if any, again.
  void answer_again(SenderRoom& r, const RankId& d);
  // A released (tombstoned) room: sends `d` the status it is owed (its cause, terminal unless
  // abandoned writes may still land). False: not a released room.
  bool answer_released(uint64_t room, const RankId& d);
  void answer_other_instance(const RoomMetadata& md);  // a room bound to another instance (prefill_metadata.cc)
  void answer_leaving(const RoomMetadata& md);  // self_leaving_: a room with no sender (nor coming_)
  void answer_refused_metadata(const RoomMetadata& md, ErrorCode code, const std::string& reason, int64_t& line_ns);
  RateLimit other_instance_answers_{20, 50};  // both answers; one warning line per 10 s of each
  int64_t other_instance_line_ns_ = 0, leaving_line_ns_ = 0;  bool self_leaving_ = false;  std::set<uint64_t> coming_;
  // Whether `r` is one of the decode ranks this rank writes `room` to (the plan and the room's DP
  // group say so; no peer's claim does). from_destination() counts and logs a refusal.
  bool is_destination(uint64_t room, const RankId& r) const;
  bool from_destination(std::string_view kind, uint64_t room, const RankId& sender);
  // prefill_final.cc: the room's final batch (aux, state and guard rows) and its Success.
  using FinalBatches = std::vector<std::pair<RankId, std::vector<WriteOp>>>;
  enum class FinalStage { kBuilt, kNotYet, kFailed };
  // Stages the guard record and builds the final batch per destination this rank writes aux to
  // (kNotYet: no staging guard row free; kFailed: the room failed, nothing is sent).
  FinalStage build_final(SenderRoom& r, FinalBatches& out);
  // build_final for the last chunk: its batches go behind that chunk's KV writes.
  FinalStage stage_final(SenderRoom& r, FinalBatches& out);
  // Every KV write completed, the last chunk came: the final batch as its own writes.
  void maybe_finish(SenderRoom& r);
  // The final batch rode with the last chunk and every write completed: Success.
  void maybe_succeed(SenderRoom& r);
  // The guard row staged for a room without an aux_index is free once no write of the room is
  // in flight after its final batch went out (not only when the room is released: a room an
  // engine holds on to must not keep other rooms from their final batch).
  void free_staging_row(SenderRoom& r);
  // A room without destinations: Success without writing.
  void conclude_room(SenderRoom& r);
  // The final batch to destination `d` (aux rows, state rows, guard row from local guard row
  // `guard`); "" or why it cannot be written (the room fails).
  std::string final_ops(const SenderRoom& r, const RankId& d, uint64_t guard, std::vector<WriteOp>& ops) const;
  void maybe_send_terminal(SenderRoom& r);
  // prefill_deadlines.cc: the transfer deadline and the abandonment of a failed room's writes.
  void check_write_deadlines(int64_t now_ns);
  void abandon(SenderRoom& r);
  // A released abandoned room keeps what confirming its drain needs (release()).
  void remember_abandoned(const SenderRoom& r);
  // prefill_links.cc: the suspects of on_transport_lost() judged (tick), and a link lost to a
  // live peer: every room bound for it fails (code peer_unreachable, origin this rank: it saw the
  // link fail, the peer did nothing wrong), one line (warning with rooms failed, info without),
  // and the same registration is connected again at once.
  void judge_suspect_links(int64_t now_ns);
  void on_link_lost(const RankId& peer, const std::string& reason, int64_t now_ns);
  // Whether a failed write batch to transport peer `pid` waits for the suspect's verdict (its
  // room then fails by that verdict, attributed as it decides) instead of failing at once.
  bool awaits_link_verdict(PeerId pid) const;
  struct SuspectLink {
    PeerId peer = 0;  // the failed transport endpoint
    std::string reason;
    int64_t deadline_ns = 0;
    int64_t probed_ns = 0;
  };
  std::map<RankId, SuspectLink> suspect_links_;  // keys are keys of peers_ (bounded by them)
  uint64_t links_lost_ = 0;
  // A completion of a write of a room that is no longer live.
  void on_abandoned_completion(uint64_t room);
  // `terminal` false: the early failure notice (Failed only); writes may still be in flight.
  void send_status(SenderRoom& r, KVPoll state, bool terminal = true);
  // The digest a Success to `d` carries: what was written to it, if its metadata asked for one
  // (every Success: the first, and one sent again to a destination that asks again).
  std::optional<uint64_t> digest_for(const SenderRoom& r, const RankId& d) const;

  EndpointCore& core_;
  std::vector<uint64_t> fresh_failures_;  // see take_fresh_failures()
  std::vector<HeadTransfer> plan_;
  uint32_t decode_dp_ = 1;
  bool wrong_head_offset_ = false;  // test-only (KVFERRY_TEST_WRONG_HEAD_OFFSET=1)
  // Test-only (KVFERRY_TEST_OMIT_DIGEST=1, read at construction): Success never carries the digest
  // decode asked for, as a prefill of an earlier build or a liar would send it.
  bool omit_digest_ = false;
  std::map<RankId, DecodePeer> peers_;
  std::set<RankId> dead_peers_;  // until they register again or answer again
  std::set<RankId> leaving_;  // peers (of peers_) whose last heartbeat said they are leaving
  std::set<RankId> left_;  // dead after leaving_, no room failed: forget_idle_instances() at once
  UnopenedHook unopened_hook_;
  UnopenedFailureHook unopened_failure_hook_;
  // Decode ranks whose last registration was refused, with the refusal's record (until one of
  // theirs is accepted; at most kMaxRefused, oldest rank order dropped first).
  std::map<RankId, Failure> refused_;
  uint64_t incompatible_refusals_ = 0;
  static constexpr size_t kMaxRefused = 1024;
  // Decode ranks whose transport connect is under way (at most Connector::kMaxInFlight).
  struct PendingConnect {
    PoolRegistration reg;
    uint64_t id = 0;
    int64_t deadline_ns = 0;
  };
  std::map<RankId, PendingConnect> connecting_;
  uint64_t next_connect_id_ = 1;
  std::map<RankId, PoolRegistration> dead_regs_;  // to reconnect a peer that answers again
  // The newest incarnation of each decode rank that connected, or whose restart was confirmed
  // (a key of peers_, connecting_ or dead_regs_): frames of older ones are stale.
  std::map<RankId, uint64_t> incarnations_;
  // See pending_restarts(): the newest unconfirmed claim of each identity (bounded by the plan),
  // with the challenge sent to its old incarnation's endpoint.
  struct HeldRestart {
    PoolRegistration reg;
    uint64_t nonce = 0;
    int64_t challenged_ns = 0;
  };
  std::map<RankId, HeldRestart> pending_restarts_;
  // The incarnation that answered a challenge at an identity's old control endpoint (it owns that
  // endpoint now: its registration is a restart); bounded by the plan.
  std::map<RankId, uint64_t> verified_owners_;
  // A peer declared dead is taken for back only once its known control endpoint answers a challenge
  // with its known incarnation (PeerMonitor::heard(proven), core.h challenge_unproven()).
  PeerChallenges revivals_;
  RateLimit challenge_answers_{10.0, 20.0};  // answers to decode ranks' challenges
  std::set<RankId> told_refusal_;  // told a refusal at an endpoint they named (once each, bounded)
  RateLimit refusal_answers_{10.0, 20.0};  // RegistrationRefusals sent, per second and burst
  RateLimit restart_probes_{5.0, 5.0};     // probes of an old incarnation's endpoint
  std::unordered_map<uint64_t, SenderRoom> rooms_;
  std::unordered_map<uint64_t, ChunkState> chunks_;
  PageAllocator aux_alloc_;
  uint64_t next_aux_tag_ = 1ull << 62;
  uint64_t refused_registrations_ = 0;
  uint64_t foreign_messages_ = 0;
  std::string last_refusal_;
  std::unordered_map<uint64_t, uint64_t> aux_tags_;  // tag -> room
  // Frames for rooms not added yet (arrival ns kept for expiry).
  std::unordered_map<uint64_t, std::vector<std::pair<int64_t, RoomMetadata>>> pending_meta_;
  std::unordered_map<uint64_t, std::pair<int64_t, RoomStatus>> pending_fail_;
  // What pending_meta_ holds, per sender and in all (kMaxPending*); a sender's entry goes with
  // its last pending metadata, so the map is bounded by pending_meta_.
  struct PendingQuota {
    size_t entries = 0;
    uint64_t indices = 0;
  };
  std::map<RankId, PendingQuota> pending_quota_;
  size_t pending_entries_ = 0;
  uint64_t pending_indices_ = 0;
  uint64_t dropped_pending_ = 0;
  // Takes the metadata kept for `room` out of pending_meta_ (and out of the counts above).
  std::vector<std::pair<int64_t, RoomMetadata>> take_pending_meta(uint64_t room);
  // Released rooms: late frames never resurrect a room or attach to a later one; late metadata
  // for a failed room is answered with its cause. A tombstone is the room id, a sequence number
  // and, for a failed room only, its cause. Each lives in one of two FIFOs (release order) next
  // to the map; tick() and release() pop from their fronts, so expiry costs O(expired) and the
  // number kept is capped (prefill_endpoint.cc, kMax*Tombstones: why dropping the oldest is safe).
  struct Tombstone {
    uint64_t seq = 0;                          // matches the FIFO entry that owns it
    std::unique_ptr<KVTransferError> cause;    // null: the room succeeded (or never failed)
    // A room that succeeded: the digests its Success carried (integrity), for a destination that
    // asks again after the release.
    std::vector<std::pair<RankId, uint64_t>> digests;
    std::optional<uint32_t> engine;  // the decode instance the room was bound to
  };
  struct TombstoneRef {
    int64_t release_ns = 0;
    uint64_t room = 0;
    uint64_t seq = 0;
  };
  void bury(uint64_t room, std::optional<KVTransferError> cause, int64_t now_ns,
            std::vector<std::pair<RankId, uint64_t>> digests = {});
  void expire_tombstones(std::deque<TombstoneRef>& fifo, size_t cap, int64_t now_ns);

  // Released rooms with abandoned writes still in flight: on the last one's completion the
  // destinations get the terminal Failed status (their quarantined pages are free again).
  struct AbandonedRoom {
    uint32_t inflight = 0;
    std::vector<RankId> dests;
    Failure failure;
  };
  std::unordered_map<uint64_t, AbandonedRoom> abandoned_;
  std::deque<uint64_t> abandoned_order_;  // release order, for the cap
  std::vector<ChunkDone> abandoned_chunks_;
  uint64_t abandoned_writes_ = 0, abandoned_completed_ = 0;
  std::unordered_map<uint64_t, Tombstone> tombstones_;
  std::deque<TombstoneRef> ok_fifo_;      // rooms released without a failure
  std::deque<TombstoneRef> failed_fifo_;  // rooms released with a failure cause
  uint64_t next_tomb_seq_ = 1;
};

}  // namespace kvferry
