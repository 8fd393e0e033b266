// DecodeEndpoint: the decode side of the manager: finds its prefill peers through the bootstrap
// service, registers its pool with each, and keeps one receiver per room.
//
// Per room (KVReceiver semantics): Bootstrapping until init() sent the metadata (destination
// kv_indices and aux slot) to every source, WaitingForInput until every source reported Success
// and the guard row holds this room, then Success. A failure (local, from a source, or from the
// engine's agreement) makes it Failed and is told once to every source that did not itself report
// it. drained() (release-safe): no source can still write into the room's pages, aux rows or
// state rows (each source we sent metadata to has sent a terminal status, which it sends only once
// none of its writes of the room is in flight; or the drain deadline passed — then the pages and
// rows must be quarantined). Failed does not imply drained.
// A source's non-terminal Failed status (an early notice, its writes may still land) fails the room
// at once but does not drain it: the source's terminal status still has to come.
//
// A source that is down (declared dead, being looked up again at the bootstrap service) may be
// back before this rank has found it: its engine can already hold a room that waits for our
// metadata. So a room added while a source is down is not failed at once: it stays Bootstrapping
// (init() sends the metadata to the live sources only) and the rest goes out when the source
// registers again. If the source is still down `lookup_timeout_ms` after its death, such a room
// fails with peer_unreachable and the source as origin (a room added after that fails at once).
// A failure that should be told to a source while it is down is told to it when it is back.
// Thread contract: main thread only.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "endpoint/core.h"
#include "kvferry/state.h"
#include "endpoint/topology.h"
#include "kvferry/bootstrap.h"
#include "kvferry/write_fence.h"

namespace kvferry {

struct PrefillPeer {
  RankId rank;
  std::string control_endpoint;
  int64_t dead_since_ns = 0;  // when it was declared dead (0: alive)
  uint64_t incarnation = 0;   // from its bootstrap entry, or its newer messages (0: not known)
  // The registration's first contact (resend_unanswered, decode_refusal.cc): the monitor's mark
  // when the peer was watched, and when the registration last went out. heard: a frame from the
  // peer came since, so it has the registration.
  int64_t watched_ns = 0;
  int64_t registered_ns = 0;
  bool heard = false;
};

struct ReceiverRoom {
  uint64_t room = 0;
  uint64_t input_tokens = 0;
  uint64_t total_pages = 0;
  RoomState state;
  std::vector<RankId> sources;
  std::set<RankId> metadata_sent;
  std::set<RankId> succeeded;
  std::set<RankId> terminal;  // sources whose terminal status arrived
  std::set<RankId> failure_heard;  // sources that told us the room failed, before their drain
  std::vector<uint64_t> kv_indices;
  uint64_t aux_index = 0;              // row in every aux buffer and guard row
  std::vector<uint64_t> state_indices; // rows in every state buffer
  // Integrity (ManagerConfig::integrity): the digest each source sent with its Success (nullopt:
  // it sent none); checked against what landed once every source succeeded (decode_conclude.cc).
  std::map<RankId, std::optional<uint64_t>> digests;
  bool failure_told = false;  // an early notice of the failure went to the sources
  bool final_told = false;    // the final answer (terminal, the root cause) went to the sources
  bool init_called = false;  // kv_indices, aux_index, state_indices set; sources still down get them later
  bool fence_open = false;   // the transport's room fence takes writes naming this room (decode_fence.cc)
  int64_t init_ns = 0;
  int64_t waiting_deadline_ns = 0;  // WaitingForInput past this fails with waiting_timeout
  int64_t success_ns = 0;
  int64_t failed_ns = 0;
  // The next time the sources that owe a status are asked again (0: not armed), and how often
  // they were (decode_reask.cc).
  int64_t next_ask_ns = 0;
  uint32_t asks = 0;
};

// A decode manager serving several prefill instances builds one endpoint per instance over its
// one core (docs/manager.md "Several prefill instances"): the endpoints share the transport's
// room fence (`fence`; null: a fence of this endpoint's own), and each watches its sources with a
// PeerMonitor of its own (`own_monitor`; false: the core's), since the ranks of two instances
// have the same RankId.
struct DecodeSharing {
  std::shared_ptr<WriteFence> fence;
  bool own_monitor = false;
};

class DecodeEndpoint {
 public:
  using Sharing = DecodeSharing;
  // `bootstrap_address` ("host:port") is used again to find a prefill peer that restarted.
  // `prefill_dp`: the prefill engine's DP size; a room is served by prefill DP rank
  // dp_rank_for_room(room, prefill_dp) (kvferry/routing.h).
  DecodeEndpoint(EndpointCore& core, std::vector<HeadTransfer> plan, std::string bootstrap_address,
                 uint32_t prefill_dp = 1, DecodeSharing sharing = DecodeSharing());
  ~DecodeEndpoint();

  // The bootstrap entries of every source prefill rank of `self_tp_rank` (every DP rank of
  // `prefill_dp`), looked up at `bootstrap` (retrying until `deadline_ns`), in (dp, tp) order.
  // Touches no endpoint: a manager calls it without its lock. Errors: as connect_peers().
  static Result<std::vector<PrefillRankInfo>> look_up_sources(const std::vector<HeadTransfer>& plan,
                                                              uint32_t self_tp_rank, uint32_t prefill_dp,
                                                              BootstrapClient& bootstrap, int64_t deadline_ns);
  // Checks each entry's fingerprint, opens the reverse data connection and registers the pool
  // with it (the second half of connect_peers()). Errors: kIncompatiblePeer, a registration that
  // could not be sent.
  Status adopt_sources(const std::vector<PrefillRankInfo>& entries);
  const std::string& bootstrap_address() const { return bootstrap_address_; }
  // The incarnation this endpoint knows for its source `peer` (nullopt: not its source).
  std::optional<uint64_t> known_incarnation(const RankId& peer) const {
    auto it = peers_.find(peer);
    return it == peers_.end() ? std::nullopt : std::optional<uint64_t>(it->second.incarnation);
  }
  // No room, no quarantined room, nothing owed or held for a source: forgetting the endpoint
  // loses nothing.
  bool idle() const {
    return rooms_.empty() && quarantined_.empty() && owed_.empty() && held_count_ == 0 && reclaimed_.empty();
  }
  // Closes the control connections to every source (the endpoint is being forgotten).
  void forget_sources();
  size_t dead_sources() const { return dead_peers_.size(); }
  // Every source left in order: each said it was leaving and was then lost (its heartbeats stopped
  // or its process went; not on its word alone) with no room failed, and none came back. The
  // manager then forgets the instance at once rather than after prefill_instance_idle_ms.
  bool departed() const {
    if (peers_.empty()) return false;
    for (const auto& [rank, p] : peers_)
      if (!left_.count(rank) || !dead_peers_.count(rank)) return false;
    return true;
  }
  // The monitor that watches this endpoint's sources (Sharing::own_monitor).
  PeerMonitor& monitor() { return own_monitor_ ? *own_monitor_ : core_.monitor(); }
  // Its own monitor's liveness figures (has_own_monitor(): counted apart from the core's).
  bool has_own_monitor() const { return own_monitor_ != nullptr; }
  LivenessStats own_monitor_stats() const { return own_monitor_ ? own_monitor_->stats() : LivenessStats{}; }

  // Looks up every source prefill rank (retrying until `deadline_ns`) and sends each the pool
  // registration. Errors: kBootstrapTimeout if a peer never registered, kPeerUnreachable if the
  // service cannot be reached.
  Status connect_peers(BootstrapClient& bootstrap, int64_t deadline_ns);
  // The source's bootstrap entry's compatibility fingerprint against ours (kvferry/compat.h),
  // before anything else of the entry is used: kIncompatiblePeer naming the first field that
  // differs and both values; logged at error once per source incarnation, and the source is sent
  // our registration so it refuses it and logs its own line (decode_compat.cc).
  Status check_source_compat(const RankId& source, const PrefillRankInfo& info);
  // A source found again by rediscovery: true when its entry's fingerprint matches ours; else its
  // rooms fail with incompatible_peer (this rank's record, its one line from check_source_compat)
  // and rooms added later for it fail at once, as for a refusal (decode_compat.cc).
  bool admit_rediscovered(const RankId& source, const PrefillRankInfo& info);

  void on_message(const Message& m);
  // Whether `sender` is a source of this rank in the agreed plan (a prefill rank of engine 0, a TP
  // rank the plan receives from; any DP rank: a room may name its own). admits() counts
  // and logs a refusal (Refusal::kOutsidePlan); the manager asks it before decoding a frame.
  bool in_plan(const RankId& sender) const;
  bool admits(const RankId& sender);

  // `prefill_dp_rank`: the prefill DP group serving the room (-1: dp_rank_for_room(room, prefill_dp)).
  // A room added with input_tokens 0 (its size not known yet) is sized by a later add_room with
  // its tokens, before init().
  void add_room(uint64_t room, uint64_t input_tokens, int64_t prefill_dp_rank = -1);
  bool has_room(uint64_t room) const { return rooms_.count(room) != 0; }
  const ReceiverRoom* room(uint64_t room) const;
  KVPoll poll(uint64_t room) const;

  // Clears the room's guard row and sends the metadata (destination pages, aux row, state rows)
  // to every source. kv_indices.size() must equal the room's page count; `aux_index` names the
  // room's row in every aux buffer and its guard row; `state_indices` its rows in every state
  // buffer (the prefill rank gives as many with its last chunk). A room that failed before init
  // (a source refused our registration, a source down past its rejoin deadline) takes the call and
  // sends nothing: it stays Failed with its cause. Errors (kInvalidArgument, nothing sent): unknown
  // room, called twice, a page, aux or state row out of range.
  Status init(uint64_t room, const std::vector<uint64_t>& kv_indices, uint64_t aux_index,
              std::span<const uint64_t> state_indices);
  // The form without state rows.
  Status init(uint64_t room, const std::vector<uint64_t>& kv_indices, uint32_t aux_slot);

  // `via`: the rank whose message told this rank (logged as "via"; `kvferry logs` orders by it).
  void fail(uint64_t room, ErrorCode code, const std::string& reason, const RankId& origin,
            int64_t first_seen_ns, bool observed_here, const RankId* via = nullptr);
  // The same with the failure record as it arrived (keeps its wall_ns).
  void fail(uint64_t room, const Failure& f, bool observed_here, const RankId* via = nullptr);
  bool drained(uint64_t room, int64_t now_ns) const;
  // Overrides the room's waiting deadline (replay's timeout faults).
  void set_waiting_deadline(uint64_t room, int64_t deadline_ns);
  // Deadlines (a room WaitingForInput past its deadline fails with waiting_timeout), dead and
  // revived peers, restarted peers found again at the bootstrap service.
  void tick(int64_t now_ns);

  // A prefill peer is dead: every room it feeds fails with origin = the peer and code
  // peer_unreachable; one line above debug. The peer is looked up again until it re-registers.
  // `gone`: its process is known to be gone (a newer incarnation of it registered), so it writes
  // nothing more and its rooms are drained. A silent peer (no heartbeat) is only presumed dead: it
  // may be alive and still writing, so its rooms drain only by its terminal status once it
  // answers again, or are quarantined by the drain deadline (docs/failure-model.md "Drain").
  // A peer that said it is leaving (Heartbeat::leaving) and has not been heard since: its loss
  // with no room failed is one info line (decode_peer_loss.cc).
  void on_peer_dead(const RankId& peer, const std::string& reason, bool gone = false);
  void on_leaving(const Heartbeat& hb);
  // Releases the room; one released before every source it sent metadata to confirmed the drain
  // is quarantined until they do (decode_quarantine.cc).
  void release(uint64_t room);

  // Quarantined rooms: released, some source still unconfirmed. Their pages and rows (the room's
  // kv_indices, its aux row and state rows) are leaked until reclaimed; take_reclaimed() returns
  // the rooms whose sources have since confirmed the drain (or died): their pages may be reused.
  size_t quarantined_rooms() const { return quarantined_.size(); }
  bool peer_dead(const RankId& peer) const { return dead_peers_.count(peer) > 0; }
  bool is_quarantined(uint64_t room) const { return quarantined_.count(room) != 0; }
  uint64_t quarantined_pages() const { return quarantined_pages_; }
  uint64_t quarantined_total() const { return quarantined_total_; }
  uint64_t reclaimed_total() const { return reclaimed_total_; }
  std::vector<uint64_t> take_reclaimed() { return std::exchange(reclaimed_, {}); }
  static constexpr size_t kMaxQuarantined = 4096;

  // Rooms whose first failure cause was recorded (fail()) since the last call, in order; a room
  // released before the call is left out (so the list stays bounded by the live rooms).
  std::vector<uint64_t> take_fresh_failures() { return std::exchange(fresh_failures_, {}); }

  size_t live_rooms() const { return rooms_.size(); }
  size_t peers() const { return peers_.size(); }
  // Sources whose refusal of our registration stands (RegistrationRefusal).
  size_t refused_peers() const { return refused_.size(); }
  // Restart claims of sources held until their old incarnation is gone (docs/security.md).
  size_t pending_restarts() const { return restart_claims_.size(); }
  // Sources asked again for a room's status, so far (one per source per ask).
  uint64_t status_asks() const { return status_asks_; }
  // Renewal heartbeats sent to sources, so far (decode_renewal.cc).
  uint64_t renewals_sent() const { return renewals_sent_; }
  static constexpr uint32_t kMaxAsks = 8;

  // The receiver-side room fence installed into this rank's transport (kvferry/write_fence.h,
  // decode_fence.cc): a room is open for writes naming it, into its pages, aux row, guard row and
  // state rows only, from init() until every source it sent metadata to is terminal (then no
  // honest write of it can come) or it is released. Refusals are counted there.
  const WriteFence& fence() const { return *fence_; }

 private:
  // decode_fence.cc.
  std::vector<FenceRange> fence_ranges(const ReceiverRoom& r) const;
  void open_fence(ReceiverRoom& r);
  // Closes the room's fence once the room is terminal and every source it sent metadata to is.
  void close_fence_if_drained(uint64_t room);
  // Closes it in any case (release); returns the placements of the room still running.
  uint64_t close_fence(ReceiverRoom& r);
  // The fence is closed and none of the room's placements runs any more.
  bool fence_done(const ReceiverRoom& r) const;
  // Closes drained rooms' fences; ends the quarantine of rooms that waited only for placements.
  void tick_fences();
  void on_status(const RoomStatus& st);
  // decode_conclude.cc: every source said Success: the room's integrity (if asked for), then its
  // guard row; Success, or the room fails (integrity_error / protocol_error, origin this rank)
  // and every source is told.
  void conclude(ReceiverRoom& r);
  // "" or why the bytes that landed do not match a source's digest (or a digest is missing).
  std::string check_integrity(const ReceiverRoom& r) const;
  // Tells every source that has not succeeded the room's failure (once; `update`: again, the root
  // cause moved).
  void tell_sources(ReceiverRoom& r, const KVTransferError& e, bool update = false);
  // `st` to the room's live sources; those that succeeded only if `succeeded`.
  void send_to_sources(ReceiverRoom& r, const RoomStatus& st, bool succeeded = false);
  // The final answer: the root cause, terminal, to every source that has not succeeded, once every
  // source is terminal or dead (its own failure, if any, is a candidate here) or the drain
  // deadline passed (or `force`: the room is released); once per room.
  void answer_sources(ReceiverRoom& r, int64_t now_ns, bool force = false);
  // decode_refusal.cc: a source refused our pool registration; a room fed by a refusing source
  // fails at once (true then).
  void on_refusal(const RegistrationRefusal& rf);
  // decode_quarantine.cc.
  // `placements`: writes of the room were still being placed when its fence closed.
  void quarantine(const ReceiverRoom& r, bool placements = false);
  void end_quarantine(uint64_t room, const std::string& why);
  void drain_confirmed(uint64_t room, const RankId& src);
  void source_gone(const RankId& src);
  // Quarantined rooms waiting for a source declared dead: once that source's process is proven
  // gone (its control endpoint refuses a connect; over tcp also: nothing answers and it has been
  // silent kHostGoneSilenceNs, the fence refusing whatever of it arrives late), no write of it can
  // land any more, so it is taken as gone (source_gone) and the rooms are reclaimed without a
  // restart. Probes rate-limited (quarantine_probes_).
  void reclaim_from_gone_sources(int64_t now_ns);
  // `src`'s process is gone (restarted): every room it feeds is drained of it, quarantined ones
  // are reclaimed.
  void source_restarted(const RankId& src);
  bool fail_if_refused(uint64_t room);
  // Refusals for a lack of room at the source (resource_exhausted: its table of decode instances
  // was full) are not for good: the registration is sent again once due (decode_refusal.cc).
  void retry_refused(int64_t now_ns);
  // A source not heard from since this rank registered (its heartbeats start once it accepted the
  // registration) is sent the same registration again every kRegistrationResendNs: a first contact
  // that took longer than the control socket's window (include/kvferry/control.h) dropped it.
  void resend_unanswered(int64_t now_ns);
  // decode_reask.cc: asks again the sources of rooms that owe a status (lost statuses).
  void arm_reask(ReceiverRoom& r, int64_t now_ns);
  void reask(int64_t now_ns);
  // decode_renewal.cc: every renew_interval, each live source is sent the rooms it feeds that
  // were add_room()ed (Receiver::init) but not init()ed (no metadata yet): their lease renewal.
  void renew(int64_t now_ns);
  // `incarnation`: the peer's, from its bootstrap entry (kvferry/messages.h; 0: not known).
  // This rank's pool registration, meant for a source of incarnation `peer_incarnation`.
  PoolRegistration make_registration(uint64_t peer_incarnation) const;
  Status send_registration(const RankId& peer, const std::string& endpoint, uint64_t incarnation);
  // Looks the dead `peer` up until its entry names another endpoint or another incarnation.
  void rediscover(const RankId& peer, const std::string& old_endpoint, uint64_t old_incarnation);
  // decode_restarts.cc. Incarnations (kvferry/messages.h): whether a `kind` message from `sender`
  // may be used. Refused and counted: meant for another incarnation of this rank, or from an
  // incarnation of `sender` older than the one known, or more than kMaxIncarnationSkewNs ahead of
  // this rank's clock. A newer plausible one is a restart claim: refused too, held (the newest per
  // source), and believed by judge_restart_claims() once the old incarnation is gone.
  bool accept_incarnation(const RankId& sender, uint64_t inc, uint64_t peer_inc, std::string_view kind);
  // Believes each held claim whose old incarnation is gone: the source's control endpoint answered
  // a challenge (kvferry/messages.h, Heartbeat) with the claimed incarnation, or the source was
  // declared dead here and its endpoint is gone (old_endpoint_gone(): a connect is refused). The
  // rooms the old one fed fail as for its death and the source is looked up again. Challenges the
  // others' endpoints, once per heartbeat interval; drops a claim the known incarnation caught up
  // with. Silence alone proves nothing (a stopped or starved source answers late).
  void judge_restart_claims(int64_t now_ns);
  // Frames of a source name an older incarnation than the known one: its known endpoint is asked
  // which incarnation owns it (ownership_checks_). The owner's answer, if older than the known one,
  // is adopted: registration and the metadata of its rooms go again under it.
  bool on_ownership_answer(const Heartbeat& hb, uint64_t known);
  void adopt_incarnation(const RankId& peer, uint64_t inc);
  // A challenge from a source is answered at its known control endpoint (rate-limited), and this
  // rank's registration is sent there again (a restart claim of ours held there is then settled by
  // our own registration). An answer settles the claim whose nonce it echoes: the claimed
  // incarnation confirms it, the known one drops it.
  void answer_challenge(const Heartbeat& hb);
  void on_challenge_answer(const Heartbeat& hb);
  void believe_restart(const RankId& peer, uint64_t inc);
  // A source that was down registered again: sends it the metadata of rooms that waited for it
  // and the failures it missed.
  void on_peer_back(const RankId& peer, const std::string& endpoint);
  // Sends the metadata to `src`; fails the room if it cannot. False if the room failed.
  bool send_metadata(ReceiverRoom& r, const RankId& src, const std::string& endpoint);
  // Bootstrapping -> WaitingForInput once every source has the metadata.
  void maybe_waiting(ReceiverRoom& r);
  // Past this a room still waiting for the dead `peer` fails (dead_since + lookup_timeout).
  int64_t rejoin_deadline_ns(const RankId& peer) const;
  // Fails every unfinished room fed by a dead peer past its rejoin deadline.
  void expire_dead_sources(int64_t now_ns);

  // A background lookup of a dead prefill peer at the bootstrap service.
  struct Rediscovery {
    std::thread thread;
    std::mutex mu;
    bool stop = false;
    std::string found;  // new control endpoint, once seen
    uint64_t found_incarnation = 0;
    PrefillRankInfo found_info;  // the whole entry: its fingerprint is checked before use
  };

  EndpointCore& core_;
  std::unique_ptr<PeerMonitor> own_monitor_;  // Sharing::own_monitor (null: the core's)
  std::vector<uint64_t> fresh_failures_;  // see take_fresh_failures()
  std::vector<HeadTransfer> plan_;
  uint32_t prefill_dp_ = 1;
  std::string bootstrap_address_;
  std::map<RankId, PrefillPeer> peers_;
  std::set<RankId> dead_peers_;
  std::set<RankId> leaving_;  // peers (of peers_) whose last heartbeat said they are leaving
  // Peers (of dead_peers_) whose death came after they said they were leaving, with no room failed
  // (until they register again): departed().
  std::set<RankId> left_;
  // Restart claims not believed yet: the newest claimed incarnation of each source (keys are
  // admitted senders: the plan bounds them) and the challenge sent to its known endpoint.
  struct RestartClaim {
    uint64_t incarnation = 0;
    uint64_t nonce = 0;
    int64_t challenged_ns = 0;
  };
  std::map<RankId, RestartClaim> restart_claims_;
  // A peer declared dead is taken for back only once its known control endpoint answers a challenge
  // with its known incarnation (PeerMonitor::heard(proven), core.h challenge_unproven()).
  PeerChallenges revivals_;
  // Challenges sent because a source's frames name an older incarnation than the one this rank
  // knows (e.g. taken from a bootstrap entry stamped ahead by a liar: attack 2d); keys: peers_ keys.
  PeerChallenges ownership_checks_;
  RateLimit restart_probes_{5.0, 5.0};       // connects to a dead source's old endpoint
  RateLimit quarantine_probes_{1.0, 1.0};    // the same, for quarantined rooms (decode_quarantine.cc): a
                                             // probe of a host that is gone blocks the tick up to 20 ms
  RateLimit challenge_answers_{10.0, 20.0};  // answers to sources' challenges
  // Sources that refused our registration, with their record (keys are peers_ keys; cleared when
  // we register with the source again).
  std::map<RankId, Failure> refused_;
  std::map<RankId, int64_t> refusal_retry_ns_;  // of refused_: when its registration goes again
  std::set<RankId> refused_before_;            // refused for room and retried: its next refusal is quiet
  // Sources that reported a room's Success since they (re)started: they use our registration, so
  // a refusal in their name is not theirs (issue 31; keys bounded by the plan).
  std::set<RankId> serving_;
  struct Quarantine {
    std::set<RankId> pending;  // sources that have not confirmed the drain
    bool placements = false;   // the fence still had placements of the room running
    uint64_t pages = 0;        // pages and rows held
  };
  std::unordered_map<uint64_t, Quarantine> quarantined_;
  std::deque<uint64_t> quarantined_order_;
  std::vector<uint64_t> reclaimed_;
  uint64_t quarantined_pages_ = 0;
  uint64_t quarantined_total_ = 0;
  uint64_t reclaimed_total_ = 0;
  uint64_t status_asks_ = 0;
  int64_t next_renew_ns_ = 0;
  uint64_t renewals_sent_ = 0;
  // Failures of rooms to tell a source that was down when they failed, sent when it is back;
  // dropped at its rejoin deadline.
  std::map<RankId, std::vector<RoomStatus>> owed_;
  // decode_reask.cc: failure statuses the control socket could not take (the source's queue was
  // full, e.g. tens of thousands of rooms failing at once), sent again from tick() in order, at
  // most kMaxHeldStatuses in all; a source's own statuses queue behind its held ones.
  void send_or_hold(const RankId& src, const std::string& endpoint, const RoomStatus& st);
  void flush_held_statuses();
  static constexpr size_t kMaxHeldStatuses = 1 << 16;
  std::map<RankId, std::deque<RoomStatus>> held_statuses_;
  size_t held_count_ = 0;
  uint64_t statuses_dropped_ = 0;  // past kMaxHeldStatuses (the source's bootstrap deadline acts)
  std::map<RankId, std::unique_ptr<Rediscovery>> rediscovery_;
  std::unordered_map<uint64_t, ReceiverRoom> rooms_;
  std::shared_ptr<WriteFence> fence_;
};

}  // namespace kvferry
