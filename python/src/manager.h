// The Python module's room table over the public kvferry::Manager (kvferry/manager.h): the
// module's calls name rooms by id (python/kvferry), so this keeps one Sender (prefill) or Receiver
// (decode) per open room and forwards each call to it. The rank itself (transport, registered
// pool, control socket, heartbeats, progress thread) is the public kvferry::Manager, built the one way a
// rank is built; each failed room is logged once by it under "prefill.connector" or
// "decode.connector" (level per manager/log_policy.h).
//
// Rooms follow SGLang's connector: a sender is opened, init(num pages) adds it, send() writes
// chunks of local page indices (the chunk that reaches the room's page count is the last); a
// receiver is opened, init(kv_indices, aux slot) sends the metadata. close_room() drops the handle:
// the manager releases the room once no write can still reach its pages.
//
// Units: pages are page_size tokens of every layer buffer; indices are pages of this rank's pool.
// Errors: bad arguments come back as kInvalidArgument naming the value; nothing is sent then.
// Thread contract: every method is thread-safe (one mutex here, the manager's own inside); the
// progress thread never calls into Python.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

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
  Role role() const { return self_.role; }

  // A sender/receiver exists for `room` (Bootstrapping until init). Errors: already open.
  Status open(uint64_t room);
  Status sender_init(uint64_t room, uint64_t num_pages, uint64_t num_tokens);
  Status sender_send(uint64_t room, const std::vector<int64_t>& pages);
  Status receiver_init(uint64_t room, const std::vector<int64_t>& kv_indices, int64_t aux_slot,
                       uint64_t num_tokens);
  KVPoll poll(uint64_t room);  // Failed for a room that is not open
  std::optional<KVTransferError> failure(uint64_t room);
  Status abort(uint64_t room, const std::string& reason);
  void close_room(uint64_t room);
  // Fault injection (tests): every later write of `room` fails in the transport with `code`.
  void inject_write_failure(uint64_t room, ErrorCode code, const std::string& reason);
  // Decode: the aux record in `slot`. Errors: slot out of range.
  Result<AuxRecord> aux(int64_t slot);
  size_t live_rooms();
  size_t peers();

 private:
  struct Room {
    std::unique_ptr<Sender> sender;
    std::unique_ptr<Receiver> receiver;
    uint64_t total_pages = 0;  // sender: from init
    uint64_t next_page = 0;    // sender: pages sent so far
  };
  Connector() = default;
  Room* find(uint64_t room);

  PoolLayout layout_;
  RankId self_;
  std::mutex mu_;
  std::unique_ptr<kvferry::Manager> m_;
  std::map<uint64_t, Room> rooms_;
};

}  // namespace kvferry::python
