// The Manager's inside (kvferry/manager.h), for kvferry's own drivers and tests only: the rank's
// EndpointCore and endpoint, finer progress steps (so a test can hold one side back) and the hook
// through which chunk completions of writes the manager's own senders did not issue reach their
// issuer (the C++ prefill driver's staging pool, the benchmark's).
//
// Everything here runs on the thread that pumps the manager; use it only with a caller-pumped
// manager (progress_thread false), which is what the drivers and the test harness build.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <atomic>
#include <condition_variable>
#include <vector>

#include "endpoint/core.h"
#include "endpoint/decode_endpoint.h"
#include "endpoint/prefill_endpoint.h"
#include "kvferry/manager.h"
#include "manager/failure_poster.h"

namespace kvferry {

class ManagerImpl final : public Manager {
 public:
  ~ManagerImpl() override;

  Result<std::unique_ptr<Sender>> sender(uint64_t room) override;
  Result<std::unique_ptr<Receiver>> receiver(uint64_t room, const std::string& prefill_bootstrap) override;
  std::vector<int> wait_fds() const override;
  void progress() override;
  const RankId& self() const override { return core_->self(); }
  const PoolLayout& layout() const override { return core_->layout(); }
  uint8_t* pool_base() const override { return core_->base(); }
  std::string control_endpoint() const override { return core_->control_endpoint(); }
  ManagerStats stats() const override;
  std::vector<uint64_t> take_reclaimed_rooms() override;
  FaultInjectingTransport* faults() override { return core_->faults(); }
  Status leave(int64_t timeout_ms) override;  // leave.cc
  bool drained() const override;

  // --- internal ---
  EndpointCore& core() { return *core_; }
  PrefillEndpoint* prefill() { return prefill_.get(); }  // null on a decode manager
  // Decode: the endpoint of the configured prefill instance, else of the first one served (null on
  // a prefill manager, or before any instance was looked up). Tests with one instance use it.
  DecodeEndpoint* decode();
  // Decode: the endpoint of the prefill instance serving the room (null: no such room).
  DecodeEndpoint* decode_of(uint64_t room) {
    auto it = rooms_.find(room);
    return it == rooms_.end() ? nullptr : it->second.ep;
  }
  const ManagerConfig& config() const { return config_; }
  const std::vector<HeadTransfer>& plan() const { return plan_; }
  // Chunk completions of writes not issued by a Sender of this manager.
  void set_chunk_done_hook(std::function<void(const ChunkDone&)> hook) { chunk_hook_ = std::move(hook); }
  // Sees every decoded control frame before the endpoint does (the benchmark's bookkeeping).
  void set_message_hook(std::function<void(const Message&)> hook) { message_hook_ = std::move(hook); }
  // progress() in pieces: control frames; transport completions; deadlines and handle releases.
  void progress_control(bool drain_waker = true);
  void progress_events();
  void progress_tick();
  // An engine's poll() of a room not yet concluded: runs progress_control() and progress_events()
  // on the engine's thread (the lock held), at most once per kInlineProgressNs, so a frame or a
  // completion that already arrived is seen by this poll instead of after the progress thread's
  // wake-up (issue 30 item 4: one thread hand-off less per room on each side).
  void progress_inline();
  static constexpr int64_t kInlineProgressNs = 2'000;

  // Tag space of the chunks written by Senders (ChunkDone.tag); other tags go to the hook.
  static constexpr uint64_t kSenderTagBase = 1ull << 48;

  // One room of a Sender or Receiver (guarded by mu_).
  struct Room {
    bool initialized = false;  // in the endpoint (init / send_metadata called)
    bool dropped = false;      // the handle is gone: released once release-safe
    bool dropped_unsafe = false;  // receiver: dropped while a write could still land (reclaim it)
    bool logged = false;       // the failure was logged (failure_log_component)
    bool posted = false;       // this rank's own failure of the room went to the failure board
    uint64_t total_pages = 0;
    std::vector<uint64_t> next_page;  // sender: per layer, the room's next page to send()
    bool last_sent = false;    // sender: the last chunk came
    uint32_t chunks_out = 0;   // sender: chunks whose writes have not completed
    uint64_t sends = 0;        // sender: send() calls that returned OK (the next one's number)
    std::unordered_map<uint64_t, uint64_t> send_of_tag;  // sender: a chunk's tag -> its send's number
    std::vector<uint64_t> completed_sends;  // sender: not yet taken (Sender::take_completed_sends)
    int64_t prefill_dp_rank = -1;  // receiver: init()
    bool dp_set = false;       // receiver: init() called (it put the room into the endpoint)
    bool metadata_sent = false;  // receiver: send_metadata() accepted
    std::optional<KVTransferError> early_failure;  // aborted before init
    TransferMetrics metrics;
    // Receiver: the prefill instance serving the room (its bootstrap address) and its endpoint,
    // which is kept while a room names it.
    std::string instance;
    DecodeEndpoint* ep = nullptr;
  };
  std::recursive_mutex& mutex() const { return mu_; }
  Room* room(uint64_t id);
  uint64_t next_tag() { return next_tag_++; }
  void log_failure_once(uint64_t id, Room& r);
  void log_unsettled_failures();
  // log_failure_once() if the room failed before init or is release-safe (its failure settled).
  void log_if_settled(uint64_t id, Room& r, int64_t now) {
    if (!r.initialized || release_safe_locked(id, r, now)) log_failure_once(id, r);
  }
  // A prefill room that fails before init() (an abort, the engine's failure, its bootstrap
  // deadline) goes into the endpoint, failed, without pages: every decode rank that sent or sends
  // its metadata is told (answered with the cause) instead of waiting out its waiting_timeout.
  // Nothing was written: release-safe once those ranks answered. False: it could not (the failure
  // then stays the room's early_failure, local).
  bool open_sender_for_failure(uint64_t id, Room& r, const Failure& f, bool observed_here);
  void wake() { core_->waker().signal(); }
  // The failure board of the room's bootstrap service (prefill: config.bootstrap_address; decode:
  // the room's prefill instance; empty: none). Takes the lock.
  std::string board_address(uint64_t room) const;
  // The room's record on the failure board, asked again until it is there or `wait_ms` passed
  // (Sender/Receiver::fail_from_agreement). Call without the lock: it blocks. After a lookup that
  // waited in vain, the next ones for kBoardQuietNs wait at most 25 ms (manager.cc), so an engine
  // whose failures are never posted (no board, an old peer) is not stalled room after room. Only
  // a board that did not answer, or kVainLookupsBeforeQuiet vain waits in a row, start that
  // window; a record found ends it.
  std::optional<Failure> look_up_failure(uint64_t room, int64_t wait_ms);
  static constexpr int64_t kBoardQuietNs = 10'000'000'000;
  static constexpr int kVainLookupsBeforeQuiet = 3;
  // Rooms of receivers dropped unsafe waiting to be taken (an engine that never takes them: later
  // names beyond this are dropped; their pages then stay with the engine, as leaked).
  static constexpr size_t kMaxReclaimedDropped = 65536;

 private:
  friend class Manager;
  explicit ManagerImpl(const ManagerConfig& c) : config_(c) {}
  Status start();
  // Decode (prefill_instances.cc): the endpoint of the prefill instance at `address`, looked up
  // and connected on its first use and kept (one lookup in flight per address: other callers
  // naming it wait for its answer; the lookup runs without the lock). `lock` holds mu_ once.
  // Errors: the lookup's (kBootstrapTimeout, kPeerUnreachable, kIncompatiblePeer), and
  // kResourceExhausted past config.max_prefill_instances.
  Result<DecodeEndpoint*> prefill_instance(const std::string& address, std::unique_lock<std::recursive_mutex>& lock);
  // A frame for the decode side: to the instance of its room, else the instance that knows its
  // sender at its incarnation, else every instance that has that source (each judges it by the
  // incarnation it knows: a restart claim, a stale frame, the answer to a challenge).
  void dispatch_decode(const Message& m);
  bool decode_admits(const RankId& sender);
  // Ticks every instance; forgets one idle past config.prefill_instance_idle_ms (not the
  // configured one).
  void tick_instances(int64_t now);
  // A room of `instance` was released.
  void room_left(const std::string& instance, int64_t now);
  void run();
  void housekeeping(int64_t now);
  // A chunk's writes are done (completed, or abandoned): a Sender's count, else the hook.
  void chunk_done(const ChunkDone& done);
  bool release_safe_locked(uint64_t id, const Room& r, int64_t now) const;

  ManagerConfig config_;
  mutable std::recursive_mutex mu_;
  std::unique_ptr<EndpointCore> core_;
  std::unique_ptr<PrefillEndpoint> prefill_;
  // Decode: the prefill instances served, by bootstrap address (prefill_instances.cc).
  struct PrefillInstance {
    std::unique_ptr<DecodeEndpoint> ep;
    uint64_t rooms = 0;         // rooms_ entries naming it
    int64_t idle_since_ns = 0;  // its last room left (0: a room is live)
    bool core_monitor = false;  // its sources are watched by the core's PeerMonitor
  };
  struct Lookup {
    bool done = false;
    Status status;
  };
  bool decoding_ = false;  // a decode manager
  std::map<std::string, PrefillInstance> instances_;
  std::map<std::string, std::shared_ptr<Lookup>> lookups_;  // in flight
  std::condition_variable_any lookup_done_;
  std::shared_ptr<WriteFence> fence_ = std::make_shared<WriteFence>();  // the instances' shared room fence
  uint64_t forgotten_reclaimed_ = 0;  // reclaimed_total() of forgotten instances
  uint64_t forgotten_instances_ = 0;
  uint64_t incompatible_seen_ = 0;  // PrefillEndpoint::incompatible_refusals() acted on
  int64_t last_inline_ns_ = 0;  // progress_inline()'s last run (guarded by mu_)
  std::vector<HeadTransfer> plan_;
  std::function<void(const ChunkDone&)> chunk_hook_;
  std::function<void(const Message&)> message_hook_;
  std::map<uint64_t, Room> rooms_;
  uint64_t next_tag_ = kSenderTagBase;
  uint64_t quarantined_rooms_ = 0;
  std::vector<uint64_t> reclaimed_dropped_;  // decode: dropped_unsafe rooms released since the last take
  FailurePoster poster_;  // this rank's own failures to the board (housekeeping)
  std::atomic<int64_t> board_quiet_until_ns_{0};
  std::atomic<int> vain_lookups_{0};  // full waits in a row whose record never came
  bool leaving_ = false;  // leave() was called (guarded by mu_): no new sender()/receiver()
  bool deregistered_ = false;  // leave() removed the bootstrap entry (guarded by mu_)
  // Prefill (guarded by mu_): the entry's removal was started / has ended (either way). It is
  // started by leave() when no room is live, else by leaver_ once none is (leave.cc).
  bool deregister_started_ = false;
  bool deregister_done_ = false;
  uint64_t forgotten_heartbeats_ = 0;  // decode: sent by the monitors of instances forgotten (mu_)
  uint64_t receivers_in_progress_ = 0;  // receiver() calls in a lookup, the lock released (mu_)
  std::thread leaver_;
  Status deregister(int64_t timeout_ms);  // the DELETE, called without mu_
  uint64_t live_rooms_locked() const;  // ManagerStats::live_rooms
  Status refuse_leaving(const char* what, uint64_t room) const;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The inside of a manager made by Manager::create.
inline ManagerImpl& internal(Manager& m) { return static_cast<ManagerImpl&>(m); }

}  // namespace kvferry
