// ShardedTransport: the UCX transport as a pool of N transfer worker shards (internal header; the
// public face is make_ucx_transport and TransportOptions::shards in kvferry/transport.h).
//
// Each shard is a UcxTransport (one ucp worker, one progress thread). All shards share one ucp
// context (created with UCP_PARAM_FIELD_MT_WORKERS_SHARED when N > 1) and the registered spans:
// shard 0 maps them, the others write from and receive into the same memory (share_spans), so a
// peer sees one set of spans, one remote key each. Over shm a put is a memcpy done by the sending
// shard's thread, over tcp each shard's worker sends its rooms' AMs and receives (and checks
// against the spans and the room fence, as a single worker does) what peers' shards send to it.
//
// Routing: room -> shard room % N, so the batches of one room go through one shard's command
// queue and stay in order; no thread per room. A peer is one PeerId for N shard endpoints: local
// shard i connects to the peer's shard i % (the peer's shard count), from its address
// (shard_address.h), so ranks with different N interoperate.
//
// Peer errors: the first endpoint error of any shard for a peer fails the whole peer: the handler
// runs once per PeerId (on the progress thread of the shard that saw it), the peer's endpoints on
// the other shards are closed, so their in-flight batches fail too, and so do later writes.
// disconnect() closes every shard's endpoint; stats() sums the shards (peers: live PeerIds).
//
// Thread contract: as Transport. Internal state (the peer table) is under one mutex, never held
// across a call that waits for a progress thread or runs a callback.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvferry/transport.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {

class ShardedTransport final : public Transport {
 public:
  // Errors: kInvalidArgument if options.shards is outside 1..kMaxTransportShards; kInternal if
  // UCX cannot be initialised.
  static Result<std::unique_ptr<ShardedTransport>> create(const TransportOptions& options,
                                                          const UcxTestHooks& hooks = {});
  // Stops every shard (last shard first: shard 0 owns the spans), then releases the context.
  ~ShardedTransport() override;

  Result<LocalRegion> create_region(uint64_t bytes) override;
  Result<std::vector<LocalRegion>> register_spans(const std::vector<MemorySpan>& spans) override;
  TransportCaps caps() const override { return shards_[0]->caps(); }
  std::string address() const override { return address_; }
  // Errors: kProtocolError (malformed address), else as UcxTransport::connect per shard.
  Result<PeerId> connect(const RemoteRegionInfo& peer) override;
  // The peer's shard i connects to our shard i % shards (connect() on its side): that shard opens
  // the reverse endpoint to it. Returns the first failure (the others are still tried).
  Status connect_reverse(const std::string& peer_address) override;
  void disconnect(PeerId peer) override;
  void write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
             std::function<void(Status)> done) override;
  void set_peer_error_handler(std::function<void(PeerId, Status)> handler) override;
  // Every shard checks incoming writes against the same fence.
  void set_write_fence(std::shared_ptr<WriteFence> fence) override;
  TransportStats stats() const override;

  size_t shard_count() const { return shards_.size(); }
  static size_t shard_of(uint64_t room, size_t shards) { return room % shards; }
  // A shard, for tests and diagnostics (rejected_incoming, describe_peer with its own peer ids).
  UcxTransport& shard(size_t i) { return *shards_[i]; }

 private:
  struct Peer {
    std::vector<PeerId> shard_peers;  // index = local shard; 0 = not connected yet
    bool connecting = true;           // connect() has not returned yet
    bool failed = false;              // a shard endpoint failed (the handler ran or connect failed)
    Status error;
  };

  explicit ShardedTransport(ucp_context_h context) : context_(context) {}
  Status share(const std::vector<LocalRegion>& regions);
  void on_shard_peer_error(size_t shard, PeerId shard_peer, Status status);
  void disconnect_shards(const std::vector<PeerId>& shard_peers, size_t except);

  ucp_context_h context_ = nullptr;  // shared by the shards (N > 1); null: shard 0 owns its own
  std::vector<std::unique_ptr<UcxTransport>> shards_;
  std::string address_;

  mutable std::mutex mu_;
  bool closing_ = false;  // destructor started: no more cross-shard disconnects
  PeerId next_peer_ = 1;
  std::unordered_map<PeerId, Peer> peers_;
  std::vector<std::unordered_map<PeerId, PeerId>> by_shard_;  // per shard: its peer id -> ours
  // Shard peer ids whose endpoint failed before connect() recorded them (consumed by connect();
  // whatever is left when no connect() is in flight belongs to disconnected peers: dropped).
  std::vector<std::unordered_map<PeerId, Status>> early_errors_;
  int connects_in_flight_ = 0;
  std::function<void(PeerId, Status)> handler_;
};

}  // namespace kvferry::ucx
