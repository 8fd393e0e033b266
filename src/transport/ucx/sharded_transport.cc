// ShardedTransport: N UcxTransport shards behind one Transport (routing, composite peers, one
// peer error per peer). make_ucx_transport lives here: every rank gets one, N = 1 included.
#include "transport/ucx/sharded_transport.h"

#include <utility>

#include "transport/ucx/shard_address.h"

namespace kvferry {

Result<std::unique_ptr<Transport>> make_ucx_transport(const TransportOptions& options) {
  auto t = ucx::ShardedTransport::create(options);
  if (!t.ok()) return t.status();
  return std::unique_ptr<Transport>(std::move(t).value());
}

namespace ucx {

Result<std::unique_ptr<ShardedTransport>> ShardedTransport::create(const TransportOptions& options,
                                                                   const UcxTestHooks& hooks) {
  if (options.shards < 1 || options.shards > kMaxTransportShards) {
    return Status(ErrorCode::kInvalidArgument,
                  "transport shards must be 1.." + std::to_string(kMaxTransportShards) + ", got " +
                      std::to_string(options.shards));
  }
  ucp_context_h context = nullptr;
  if (options.shards > 1) {
    auto c = UcxTransport::create_context(options, hooks, /*shared_workers=*/true);
    if (!c.ok()) return c.status();
    context = c.value();
  }
  std::unique_ptr<ShardedTransport> t(new ShardedTransport(context));
  t->by_shard_.resize(options.shards);
  t->early_errors_.resize(options.shards);
  std::vector<std::string> addresses;
  for (uint32_t i = 0; i < options.shards; ++i) {
    auto shard = UcxTransport::create(options, hooks, context);
    if (!shard.ok()) return shard.status();  // ~ShardedTransport stops the shards made so far
    addresses.push_back(shard.value()->address());
    ShardedTransport* self = t.get();
    shard.value()->set_peer_error_handler([self, i](PeerId p, Status st) {
      self->on_shard_peer_error(i, p, std::move(st));
    });
    t->shards_.push_back(std::move(shard).value());
  }
  t->address_ = encode_shard_address(addresses);
  return t;
}

ShardedTransport::~ShardedTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  while (!shards_.empty()) shards_.pop_back();  // joins each shard's progress thread
  if (context_ != nullptr) ucp_cleanup(context_);
}

Result<LocalRegion> ShardedTransport::create_region(uint64_t bytes) {
  auto region = shards_[0]->create_region(bytes);
  if (!region.ok()) return region;
  Status st = share({*region});
  if (!st.ok()) return st;
  return region;
}

Result<std::vector<LocalRegion>> ShardedTransport::register_spans(const std::vector<MemorySpan>& spans) {
  auto regions = shards_[0]->register_spans(spans);
  if (!regions.ok()) return regions;
  Status st = share(*regions);
  if (!st.ok()) return st;
  return regions;
}

void ShardedTransport::set_write_fence(std::shared_ptr<WriteFence> fence) {
  for (auto& shard : shards_) shard->set_write_fence(fence);
}

Status ShardedTransport::share(const std::vector<LocalRegion>& regions) {
  std::vector<LocalSpanView> views;
  views.reserve(regions.size());
  for (const LocalRegion& r : regions) views.push_back({r.offset, r.bytes, r.base});
  for (size_t i = 1; i < shards_.size(); ++i) {
    Status st = shards_[i]->share_spans(views);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

namespace {

// A peer's (sharded) worker address, its size checked before it is parsed.
Result<std::vector<std::string>> parse_peer_address(const std::string& address) {
  if (address.size() > kMaxWorkerAddressBytes) {
    return Status(ErrorCode::kProtocolError, "peer worker address of " + std::to_string(address.size()) +
                                                 " bytes (at most " + std::to_string(kMaxWorkerAddressBytes) + ")");
  }
  return parse_shard_address(address);
}

}  // namespace

Status ShardedTransport::connect_reverse(const std::string& peer_address) {
  auto remote = parse_peer_address(peer_address);
  if (!remote.ok()) return remote.status();
  Status first;
  for (size_t i = 0; i < remote->size(); ++i) {
    Status s = shards_[i % shards_.size()]->connect_reverse((*remote)[i]);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Result<PeerId> ShardedTransport::connect(const RemoteRegionInfo& info) {
  auto remote = parse_peer_address(info.worker_address);
  if (!remote.ok()) return remote.status();
  PeerId id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_peer_++;
    peers_[id].shard_peers.assign(shards_.size(), 0);
    connects_in_flight_++;
  }
  Status failure;
  for (size_t i = 0; i < shards_.size() && failure.ok(); ++i) {
    RemoteRegionInfo one = info;
    one.worker_address = (*remote)[i % remote->size()];
    auto r = shards_[i]->connect(one);
    if (!r.ok()) {
      failure = r.status();
      break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    Peer& p = peers_[id];
    p.shard_peers[i] = r.value();
    by_shard_[i][r.value()] = id;
    if (auto e = early_errors_[i].find(r.value()); e != early_errors_[i].end()) {
      p.failed = true;  // failed between the shard's connect and now
      p.error = e->second;
      early_errors_[i].erase(e);
    }
    if (p.failed) failure = p.error;
  }
  std::vector<PeerId> shard_peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--connects_in_flight_ == 0) {
      for (auto& early : early_errors_) early.clear();
    }
    Peer& p = peers_[id];
    p.connecting = false;
    if (failure.ok() && p.failed) failure = p.error;
    if (failure.ok()) return id;
    shard_peers = std::move(p.shard_peers);
    for (size_t i = 0; i < shard_peers.size(); ++i) by_shard_[i].erase(shard_peers[i]);
    peers_.erase(id);
  }
  disconnect_shards(shard_peers, shards_.size());
  if (failure.code() == ErrorCode::kProtocolError) return failure;  // e.g. remote key rejected
  return Status(ErrorCode::kPeerUnreachable, failure.message());
}

void ShardedTransport::disconnect_shards(const std::vector<PeerId>& shard_peers, size_t except) {
  for (size_t i = 0; i < shard_peers.size(); ++i) {
    if (i != except && shard_peers[i] != 0) shards_[i]->disconnect(shard_peers[i]);
  }
}

void ShardedTransport::disconnect(PeerId id) {
  std::vector<PeerId> shard_peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(id);
    if (it == peers_.end() || it->second.connecting) return;
    shard_peers = std::move(it->second.shard_peers);
    for (size_t i = 0; i < shard_peers.size(); ++i) by_shard_[i].erase(shard_peers[i]);
    peers_.erase(it);
  }
  disconnect_shards(shard_peers, shards_.size());
}

void ShardedTransport::write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
                             std::function<void(Status)> done) {
  const size_t s = shard_of(room, shards_.size());
  PeerId shard_peer = 0;  // unknown: the shard fails the batch ("not connected")
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(peer);
    if (it != peers_.end()) shard_peer = it->second.shard_peers[s];
  }
  shards_[s]->write(shard_peer, room, std::move(ops), std::move(done));
}

void ShardedTransport::on_shard_peer_error(size_t shard, PeerId shard_peer, Status status) {
  std::function<void(PeerId, Status)> handler;
  PeerId id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    auto b = by_shard_[shard].find(shard_peer);
    if (b == by_shard_[shard].end()) {  // connect() has not recorded it yet
      early_errors_[shard].emplace(shard_peer, std::move(status));
      return;
    }
    id = b->second;
    Peer& p = peers_.at(id);
    if (p.failed) return;  // reported once per peer
    p.failed = true;
    p.error = status;
    if (p.connecting) return;  // connect() reports it
    handler = handler_;
    // Only enqueues a close on each shard's thread (no UCX call, no callback), under the lock
    // so the destructor cannot remove a shard meanwhile.
    disconnect_shards(p.shard_peers, shard);
  }
  if (handler) {
    try {
      handler(id, std::move(status));
    } catch (...) {
    }
  }
}

void ShardedTransport::set_peer_error_handler(std::function<void(PeerId, Status)> handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handler_ = std::move(handler);
}

TransportStats ShardedTransport::stats() const {
  TransportStats sum;
  for (const auto& s : shards_) {
    TransportStats one = s->stats();
    sum.bytes_written += one.bytes_written;
    sum.writes += one.writes;
    sum.batches += one.batches;
    sum.failed_batches += one.failed_batches;
    sum.locked_bytes += one.locked_bytes;
    sum.unlocked_bytes += one.unlocked_bytes;
    sum.residency_warnings += one.residency_warnings;
    sum.tcp_sockets_tuned += one.tcp_sockets_tuned;
    sum.tcp_congestion_failures += one.tcp_congestion_failures;
    sum.reverse_peers += one.reverse_peers;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, p] : peers_) {
    if (!p.connecting && !p.failed) sum.peers++;
  }
  return sum;
}

}  // namespace ucx
}  // namespace kvferry
