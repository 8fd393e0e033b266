// The Python module's room table over the public kvferry::Manager (kvferry/manager.h): the
// module's calls name rooms by id (python/kvferry), so this keeps one Sender (prefill) or Receiver
// (decode) per open room and forwards each call to it. The rank itself (transport, registered
// pool, control socket, heartbeats, progress thread) is the public kvferry::Manager, built the one way a
// rank is built; each failed room is logged once by it under "prefill.connector" or
// "decode.connector" (level per manager/log_policy.h).
//
// Rooms follow SGLang's connector: a sender is opened, init(num pages, aux row) adds it, send()
// writes chunks of local page indices (last: given, or inferred as the chunk that reaches the
// room's page count; a last chunk may carry no pages, only state rows); a receiver is opened
// (with the prefill instance's bootstrap address and DP rank), init(kv_indices, aux row, state
// rows) sends the metadata. release_safe() tells the engine when it may free a room's pages and
// rows (Failed does not imply it). close_room() drops the handle: the manager releases the room
// once no write can still reach its pages.
//
// Memory: the engine's buffers (kvferry/buffers.h: KV buffers per layer tensor, aux and state
// buffers), or one contiguous pool laid out by kvferry (kvferry/geometry.h PoolLayout).
// Units: pages are page_size tokens of every KV buffer; rows are aux/state items.
// Errors: bad arguments come back as kInvalidArgument naming the value; nothing is sent then.
// Thread contract: every method is thread-safe (one mutex here, the manager's own inside); the
// progress thread never calls into Python.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvferry/buffers.h"
#include "kvferry/error.h"
#include "kvferry/geometry.h"
#include "kvferry/manager.h"
#include "kvferry/poll.h"
#include "kvferry/transport.h"

namespace kvferry::python {

struct ConnectorConfig {
  Role role = Role::kPrefill;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint32_t peer_tp_size = 0;  // the other engine's TP size (0: same as tp_size)
  uint32_t dp_rank = 0;       // this rank's DP group (each DP group is its own TP engine; kvferry/routing.h)
  uint32_t peer_dp_size = 1;  // the other engine's DP size (ManagerConfig::peer_dp_size)
  uint32_t engine_id = 0;     // decode: its instance's engine_id (ManagerConfig::self); prefill: 0
  ModelGeometry model;        // name, layers, tensors per layer, KV heads (global), head_dim, dtype
  uint32_t page_size = 16;    // tokens
  uint32_t aux_slots = 64;
  std::string bootstrap;      // "host:port" of the bootstrap service
  std::string transport = "shm";  // a registered transport name (kvferry/transport.h)
  uint32_t transfer_shards = 1;  // TransportOptions::shards (1..kMaxTransportShards)
  Deadlines deadlines;
  // The engine's buffers (valid until close()); empty: the contiguous pool below.
  std::vector<BufferDesc> buffers;
  uint8_t* pool = nullptr;    // the engine's pool; the layout uses as many pages as fit
  uint64_t pool_bytes = 0;
  std::string log_file;       // optional JSON log file of this rank
  // The control socket's bind host, advertised host and port (kvferry/net.h; defaults: loopback, any port).
  std::string control_bind;
  std::string control_advertise;
  uint16_t control_port = 0;
  // true: the manager logs each failed room once (manager/log_policy.h); false: the engine logs
  // failures itself (SGLang's scheduler does, by KVTransferError.is_from_another_rank).
  bool log_failures = true;
  // Wrap the transport in the fault-injecting decorator (tests, replay): inject_write_failure,
  // hold_writes. Off by default: an engine's path has no decorator, and its hooks answer
  // kInvalidArgument.
  bool fault_injection = false;
  bool integrity = false;  // ManagerConfig::integrity
};

// The layout of a pool of `num_pages` pages (sizing helper for engines).
Result<PoolLayout> layout_for_pages(const ConnectorConfig& c, uint64_t num_pages);

class Connector {
 public:
  // Builds the rank (kvferry::Manager::create with a progress thread and the fault decorator).
  static Result<std::unique_ptr<Connector>> create(const ConnectorConfig& config);
  ~Connector();  // close()
  // Drops every handle and tears the rank down (transport first). Idempotent.
  void close();

  const PoolLayout& layout() const { return layout_; }
  const RankId& self() const { return self_; }
  std::string control_endpoint();  // advertised, "tcp://host:port"
  Role role() const { return self_.role; }

  // A sender/receiver exists for `room` (Bootstrapping until init). Decode: `prefill_bootstrap`
  // ("host:port"; empty: the configured one) and `prefill_dp_rank` (-1: by room) name the prefill
  // side. Errors: already open, a bad DP rank, the lookup failing.
  Status open(uint64_t room, const std::string& prefill_bootstrap = "", int64_t prefill_dp_rank = -1);
  Status sender_init(uint64_t room, uint64_t num_pages, int64_t aux_index, uint64_t num_tokens);
  // `last`: nullopt infers it (after this chunk every layer reached init's page count); an empty
  // chunk must be last. `layers`: [begin, end) of the model's layers (Sender::send with a
  // LayerRange, kvferry/manager.h); nullopt: every layer. Errors: a negative or empty range, and
  // those of Sender::send.
  Status sender_send(uint64_t room, const std::vector<int64_t>& pages, const std::vector<int64_t>& state_indices,
                     std::optional<bool> last, std::optional<std::pair<int64_t, int64_t>> layers = std::nullopt);
  Status receiver_init(uint64_t room, const std::vector<int64_t>& kv_indices, int64_t aux_slot,
                       const std::vector<int64_t>& state_indices, uint64_t num_tokens);
  // Sender::take_completed_sends() (kvferry/manager.h): numbers of the room's send() calls whose
  // writes ended since the last call. Errors: not open, not a sender.
  Result<std::vector<uint64_t>> take_completed_sends(uint64_t room);
  // The room's Sender/Receiver::release_safe() (kvferry/manager.h). Errors: the room is not open.
  Result<bool> release_safe(uint64_t room);
  // Receiver::quarantined(); false for a sender. Errors: the room is not open.
  Result<bool> quarantined(uint64_t room);
  // A failure the engine learned from another rank (its agreement): Sender/Receiver::fail_from_engine
  // with `origin`'s failure; no-op on a room that already ended. Errors: not open.
  Status fail_from_engine(uint64_t room, ErrorCode code, const std::string& reason, const RankId& origin);
  // The engine agreed the room failed; its root cause from the failure board, else this fallback
  // (origin this rank): Sender/Receiver::fail_from_agreement. Holds this connector's lock while it
  // waits (up to wait_ms).
  Result<KVTransferError> fail_from_agreement(uint64_t room, ErrorCode code, const std::string& reason, int64_t wait_ms);
  KVPoll poll(uint64_t room);  // Failed for a room that is not open
  // The room's Sender/Receiver::metrics(); for a room closed already, its metrics when it was
  // closed (the last kMaxClosedMetrics closed rooms): SGLang's prefill calls clear() on a sender
  // before get_transfer_metric() (scheduler, process_disagg_prefill_inflight_queue). Errors: the
  // room is neither open nor among those.
  Result<TransferMetrics> metrics(uint64_t room);
  static constexpr size_t kMaxClosedMetrics = 4096;
  std::optional<KVTransferError> failure(uint64_t room);
  Status abort(uint64_t room, const std::string& reason);
  // Sender/Receiver::fail: a local failure of this rank with `code`. Errors: not open.
  Status fail_local(uint64_t room, ErrorCode code, const std::string& reason);
  void close_room(uint64_t room);
  // Fault injection (config.fault_injection; else each answers kInvalidArgument saying so): every
  // later write of `room` fails in the transport with `code`.
  Status inject_write_failure(uint64_t room, ErrorCode code, const std::string& reason);
  // The room's next write batch lands with one byte flipped (FaultInjectingTransport::
  // corrupt_next_write); the transport reports success.
  Status corrupt_next_write(uint64_t room);
  // Test hooks over the fault decorator (kvferry/fault_transport.h): later writes of `room` stay in
  // flight (queued) until release_held_writes(room); held_writes() counts the queued ones.
  Status hold_writes(uint64_t room);
  Status release_held_writes(uint64_t room);
  Result<size_t> held_writes(uint64_t room);
  // Decode over the contiguous pool: kvferry's aux record in `slot`. Errors: slot out of range,
  // engine buffers (the engine reads its own aux buffers).
  Result<AuxRecord> aux(int64_t slot);
  size_t live_rooms();
  size_t peers();
  // Manager::leave() and drained() (kvferry/manager.h): no new rooms, the bootstrap entry removed
  // (prefill); drained once no room is open or being released.
  Status leave(int64_t timeout_ms);
  bool drained();
  // Decode: Manager::take_reclaimed_rooms() (kvferry/manager.h): rooms closed quarantined, or
  // closed before they were release-safe, whose pages may be reused now; each once.
  std::vector<uint64_t> take_reclaimed_rooms();

 private:
  struct Room {
    // Shared: fail_from_agreement() keeps the handle while it waits for the failure board without
    // this connector's lock (a close() meanwhile drops the handle once that call is done).
    std::shared_ptr<Sender> sender;
    std::shared_ptr<Receiver> receiver;
    uint64_t total_pages = 0;  // sender: from init
    std::vector<uint64_t> next_page;  // sender: per layer, pages sent so far
  };
  Connector() = default;
  Room* find(uint64_t room);
  Status no_faults() const;

  PoolLayout layout_;
  RankId self_;
  std::mutex mu_;
  std::condition_variable agreements_done_;
  int agreements_waiting_ = 0;  // fail_from_agreement() and leave() calls running without mu_ (close() waits)
  std::unique_ptr<kvferry::Manager> m_;
  std::map<uint64_t, Room> rooms_;
  std::map<uint64_t, TransferMetrics> closed_metrics_;  // see metrics(); oldest first in closed_order_
  std::deque<uint64_t> closed_order_;
};

}  // namespace kvferry::python
