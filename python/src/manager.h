// The per-rank manager behind the Python module (python/kvferry): one EndpointCore over a pool the
// engine owns (registered with the transport, not copied), the prefill or decode endpoint, and a
// progress thread that runs the rank's main loop (control frames, transport completions,
// deadlines, heartbeat verdicts) so the engine only calls the connector methods below.
//
// Rooms follow SGLang's connector: a sender (prefill) is opened, init(num pages) adds it, send()
// writes chunks of local page indices; a receiver (decode) is opened, init(kv_indices, aux slot)
// sends the metadata. poll() returns KVPoll; a failed room's KVTransferError comes from the
// endpoint's failure registry (first cause, origin, is_from_another_rank). Each failed room is
// logged once on this rank with the level of driver/log_policy.h (error on a decode origin,
// warning on a prefill origin, info for an abort, debug where it was propagated).
// close() releases a room once no write can still reach its pages (drained).
//
// Units: pages are page_size tokens of every layer buffer; indices are pages of this rank's pool.
// Errors: bad arguments (index out of range, duplicate destination pages, wrong counts, unknown
// room) come back as kInvalidArgument with a sentence naming the value; nothing is sent then.
// Thread contract: every public method is thread-safe (one mutex; blocking calls may be made with
// the Python GIL released); the progress thread never calls into Python.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/core.h"
#include "endpoint/decode_endpoint.h"
#include "endpoint/prefill_endpoint.h"
#include "kvferry/error.h"
#include "kvferry/geometry.h"
#include "kvferry/poll.h"

namespace kvferry::python {

struct ManagerConfig {
  Role role = Role::kPrefill;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint32_t peer_tp_size = 0;  // the other engine's TP size (0: same as tp_size)
  ModelGeometry model;        // name, layers, tensors per layer, KV heads (global), head_dim, dtype
  uint32_t page_size = 16;    // tokens
  uint32_t aux_slots = 64;
  std::string bootstrap;      // "host:port" of the bootstrap service
  std::string transport = "shm";  // a registered transport name (kvferry/transport.h)
  uint32_t transfer_shards = 1;  // TransportOptions::shards (1..kMaxTransportShards)
  Deadlines deadlines;
  uint8_t* pool = nullptr;    // the engine's pool; the layout uses as many pages as fit
  uint64_t pool_bytes = 0;
  std::string log_file;       // optional JSON log file of this rank
};

// The layout of a pool of `num_pages` pages (sizing helper for engines).
Result<PoolLayout> layout_for_pages(const ManagerConfig& c, uint64_t num_pages);

class Manager {
 public:
  // Builds the rank: prefill registers at the bootstrap service; decode looks its prefill peers
  // up there (blocking up to deadlines.lookup_timeout_ms) and registers its pool with each.
  static Result<std::unique_ptr<Manager>> create(const ManagerConfig& config);
  ~Manager();  // close()
  // Stops the progress thread and tears the rank down (transport first). Idempotent.
  void close();

  const PoolLayout& layout() const { return layout_; }
  const RankId& self() const { return self_; }
  Role role() const { return self_.role; }

  // A sender/receiver exists for `room` (Bootstrapping until init). Errors: already open.
  Status open(uint64_t room);
  // Prefill: the room has `num_pages` pages (`num_tokens` for the aux record; 0: num_pages pages).
  Status sender_init(uint64_t room, uint64_t num_pages, uint64_t num_tokens);
  // Prefill: writes the room's next pages from local pool pages `pages` (a chunk).
  Status sender_send(uint64_t room, const std::vector<int64_t>& pages);
  // Decode: destination pages (one per room page) and aux slot; sends the metadata to the sources.
  Status receiver_init(uint64_t room, const std::vector<int64_t>& kv_indices, int64_t aux_slot,
                       uint64_t num_tokens);
  KVPoll poll(uint64_t room);
  std::optional<KVTransferError> failure(uint64_t room);
  // Fails the room here (code aborted, origin this rank) and tells the peers.
  Status abort(uint64_t room, const std::string& reason);
  // The engine is done with the room: released once drained (at once if it never started).
  void close_room(uint64_t room);
  // Fault injection (tests): every later write of `room` fails in the transport with `code`.
  void inject_write_failure(uint64_t room, ErrorCode code, const std::string& reason);
  // Decode: the aux record in `slot`. Errors: slot out of range.
  Result<AuxRecord> aux(int64_t slot);
  size_t live_rooms();
  size_t peers();

 private:
  struct Room {
    bool initialized = false;
    bool logged = false;
    bool closing = false;
    uint64_t next_page = 0;  // sender: pages handed to send() so far
    uint64_t total_pages = 0;
    std::optional<KVTransferError> early_failure;  // aborted before init
  };
  Manager() = default;
  void run();
  void pump_locked(int64_t now);
  KVPoll poll_locked(uint64_t room, const Room& r) const;
  std::optional<KVTransferError> failure_locked(uint64_t room, const Room& r);
  void log_failure_locked(uint64_t room, const KVTransferError& e);

  ManagerConfig config_;
  PoolLayout layout_;
  RankId self_;
  std::mutex mu_;
  std::unique_ptr<EndpointCore> core_;
  std::unique_ptr<PrefillEndpoint> prefill_;
  std::unique_ptr<DecodeEndpoint> decode_;
  std::map<uint64_t, Room> rooms_;
  uint64_t next_tag_ = 1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvferry::python
