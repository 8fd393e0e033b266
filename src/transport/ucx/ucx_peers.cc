// UcxTransport: peers. connect (endpoint + remote key + wire-up flush), disconnect, endpoint
// errors (peer error-handling mode) and endpoint close. Progress thread except the public entries.
#include <future>

#include "kvferry/log.h"
#include "transport/ucx/ucx_config.h"
#include "transport/ucx/shm_mapping.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {

Result<PeerId> UcxTransport::connect(const RemoteRegionInfo& info) {
  if (on_progress_thread()) {
    return Result<PeerId>(ErrorCode::kInternal, "connect called from a completion callback");
  }
  auto answer = std::make_shared<std::promise<Result<PeerId>>>();
  auto result = answer->get_future();
  bool posted = post([this, info, answer] {
    start_connect(info, [answer](Result<PeerId> r) { answer->set_value(std::move(r)); });
  });
  if (!posted) return Result<PeerId>(ErrorCode::kInternal, "transport is shut down");
  return result.get();
}

Status UcxTransport::connect_reverse(const std::string& peer_address) {
  if (on_progress_thread()) return {ErrorCode::kInternal, "connect_reverse called from a completion callback"};
  auto answer = std::make_shared<std::promise<Result<PeerId>>>();
  auto result = answer->get_future();
  bool posted = post([this, peer_address, answer] {
    start_reverse(peer_address, [answer](Result<PeerId> r) { answer->set_value(std::move(r)); });
  });
  if (!posted) return {ErrorCode::kInternal, "transport is shut down"};
  Result<PeerId> r = result.get();
  return r.ok() ? Status::Ok() : r.status();
}


void UcxTransport::start_connect(const RemoteRegionInfo& info,
                                 std::function<void(Result<PeerId>)> reply) {
  if (shutting_down_) return reply(Result<PeerId>(ErrorCode::kInternal, "shutting down"));
  // Every byte of the peer's announcement is checked before UCX parses any of it (ucx_layout.h).
  std::vector<size_t> order;
  Status valid = check_remote_info(info, mode_ == WriteMode::kPut, &order);
  std::vector<SegmentHold> holds;
  if (valid.ok()) valid = check_peer_keys(info, order, &holds);
  if (!valid.ok()) return reply(Result<PeerId>(valid.code(), "connect: " + valid.message()));
  auto owned = std::make_unique<Peer>();
  owned->spans.reserve(order.size());
  for (size_t k : order) {
    owned->spans.push_back({info.spans[k].offset, info.spans[k].bytes, info.spans[k].base, nullptr});
  }
  create_and_wire(std::move(owned), info.worker_address, order, &info, &holds, std::move(reply));
}

Status UcxTransport::check_peer_keys(const RemoteRegionInfo& info, const std::vector<size_t>& order,
                                     std::vector<SegmentHold>* holds) {
  WorkerAddressLayout peer;
  Status st = check_peer_address(layout_, info.worker_address, &peer);
  if (!st.ok() || mode_ != WriteMode::kPut) return st;
  holds->resize(order.size());
  for (size_t j = 0; j < order.size(); ++j) {
    SegmentClaim claim;
    st = check_peer_rkey(layout_, peer, info.spans[order[j]].packed_rkey, &claim);
    if (st.ok()) st = (*holds)[j].acquire(claim);
    if (!st.ok()) return {st.code(), "span " + std::to_string(order[j]) + ": " + st.message()};
  }
  return Status::Ok();
}

void UcxTransport::start_reverse(const std::string& address, std::function<void(Result<PeerId>)> reply) {
  if (shutting_down_) return reply(Result<PeerId>(ErrorCode::kInternal, "shutting down"));
  // Only the tcp lane has a connection whose direction matters (docs/transport.md).
  if (mode_ != WriteMode::kActiveMessage || tls_.find("tcp") == std::string::npos) return reply(PeerId{0});
  if (address.size() > kMaxWorkerAddressBytes)
    return reply(Result<PeerId>(ErrorCode::kProtocolError, "connect_reverse: peer worker address of " +
                                                                std::to_string(address.size()) + " bytes"));
  WorkerAddressLayout parsed;
  Status valid = check_peer_address(layout_, address, &parsed);  // before UCX parses it (ucx_layout.h)
  if (!valid.ok()) return reply(Result<PeerId>(valid.code(), "connect_reverse: " + valid.message()));
  // The peer's connect pairs with this endpoint and answers (acks) travel back over it, so a live
  // one is never closed to make room: beyond the bound the peer simply connects its own way.
  size_t live_reverse = 0;
  for (const auto& [id, p] : peers_) {
    if (!p->reverse || p->state != Peer::State::kLive) continue;
    if (p->address == address) return reply(id);  // one is enough
    ++live_reverse;
  }
  if (live_reverse >= kMaxReversePeers)
    return reply(Result<PeerId>(ErrorCode::kResourceExhausted,
                                "connect_reverse: " + std::to_string(live_reverse) + " reverse endpoints open"));
  auto owned = std::make_unique<Peer>();
  owned->reverse = true;
  owned->address = address;
  create_and_wire(std::move(owned), address, {}, nullptr, nullptr, std::move(reply));
}

void UcxTransport::create_and_wire(std::unique_ptr<Peer> owned, const std::string& address,
                                   const std::vector<size_t>& order, const RemoteRegionInfo* info,
                                   std::vector<SegmentHold>* holds, std::function<void(Result<PeerId>)> reply) {
  Peer& peer = *owned;
  peer.owner = this;
  peer.id = next_peer_id_++;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxTransport::on_ep_error;
  ep.err_handler.arg = &peer;
  ucs_status_t s = ucp_ep_create(worker_, &ep, &peer.ep);
  if (s != UCS_OK) {
    return reply(ucx_error(ErrorCode::kPeerUnreachable, peer_name(peer.id) + ": ucp_ep_create", s));
  }
  PeerId id = peer.id;
  peers_.emplace(id, std::move(owned));
  (peer.reverse ? reverse_peers_ : live_peers_)++;
  if (mode_ == WriteMode::kPut && info != nullptr) {
    for (size_t j = 0; j < order.size(); ++j) {
      // Which mapping this very unpack creates (shm_mapping.h): its segment's, new since now.
      SegmentHold* hold = holds != nullptr && j < holds->size() ? &(*holds)[j] : nullptr;
      const bool segment = hold != nullptr && hold->holds_segment();
      {
        // No other thread of this process maps or unmaps a peer's segment in between
        // (shm_segments.h segment_mapping_lock).
        std::lock_guard<std::mutex> lock(segment_mapping_lock());
        std::vector<Mapping> before = segment ? read_mappings() : std::vector<Mapping>();
        s = ucp_ep_rkey_unpack(peer.ep, info->spans[order[j]].packed_rkey.data(), &peer.spans[j].rkey);
        if (s == UCS_OK && segment) {
          peer.spans[j].segment = true;
          peer.spans[j].fresh =
              new_mappings(before, read_mappings(), hold->inode(), hold->check_device(), hold->device());
        }
      }
      if (hold != nullptr) hold->release();
      if (s != UCS_OK) {
        peer.spans[j].rkey = nullptr;
        do_disconnect(id);
        return reply(ucx_error(ErrorCode::kProtocolError,
                               peer_name(id) + ": remote key of span " + std::to_string(order[j]) +
                                   " rejected",
                               s));
      }
    }
    Status mapped = check_mapped_spans(peer);
    if (!mapped.ok()) {
      do_disconnect(id);
      return reply(Result<PeerId>(mapped.code(), peer_name(id) + ": " + mapped.message()));
    }
  }
  // Wait for wire-up before answering: the peer is known reachable, and no wire-up reply is left
  // pending in the peer's worker (UCX 1.13 aborts on an assertion when it purges one, e.g. when
  // this side disappears right after connecting).
  auto* ctx = new ConnectCtx{};
  ctx->owner = this;
  ctx->id = id;
  ctx->deadline = std::chrono::steady_clock::now() + kConnectTimeout;
  ctx->peer_address = address;
  ctx->reply = std::move(reply);
  connects_.insert(ctx);
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = &UcxTransport::on_connect_flushed;
  prm.user_data = ctx;
  void* req = nullptr;
  if (mode_ == WriteMode::kPut) {
    req = ucp_ep_flush_nbx(peer.ep, &prm);
  } else {
    ctx->ping_token = fresh_batch_id();
    ctx->ping.batch_id = ctx->ping_token;
    pings_.emplace(ctx->ping_token, ctx);
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    req = ucp_am_send_nbx(peer.ep, kAmPingId, nullptr, 0, &ctx->ping, sizeof(ctx->ping), &prm);
  }
  if (UCS_PTR_IS_ERR(req)) {
    complete_connect(*ctx, ucx_failure("wire-up", UCS_PTR_STATUS(req)));
  } else if (req != nullptr) {
    ctx->requests++;
  } else if (mode_ == WriteMode::kPut) {
    complete_connect(*ctx, Status::Ok());  // flushed at once
  }
  release_connect_if_idle(*ctx);
}

Status UcxTransport::check_mapped_spans(Peer& peer) {
  std::vector<AddressRange> taken;  // our own spans and every other peer's checked ones
  for (const LocalSpanView& own : spans_.spans()) {
    const auto lo = reinterpret_cast<uintptr_t>(own.base);
    taken.push_back({lo, lo + own.bytes});
  }
  for (const auto& [other_id, other] : peers_) {
    if (other.get() == &peer) continue;
    for (const Peer::Span& sp : other->spans)
      if (sp.local != 0) taken.push_back({sp.local, sp.local + sp.bytes});
  }
  for (size_t j = 0; j < peer.spans.size(); ++j) {
    Peer::Span& sp = peer.spans[j];
    void* local = nullptr;
    // Only a shared-memory rkey has a local address (UCX's mm transports): a put is a memcpy there.
    if (sp.rkey == nullptr || ucp_rkey_ptr(sp.rkey, sp.base, &local) != UCS_OK) continue;
    // Only the mapping this span's own unpack created (shm_mapping.h).
    if (!sp.segment)
      return {ErrorCode::kProtocolError, "span " + std::to_string(j) + " refused: mapped, but its remote key names no segment"};
    Status st = check_peer_mapping(local, sp.bytes, taken, &sp.fresh);
    if (!st.ok()) return {ErrorCode::kProtocolError, "span " + std::to_string(j) + " refused: " + st.message()};
    sp.local = reinterpret_cast<uintptr_t>(local);
  }
  // The copy of every put runs in this process, into these mappings: fault them in and lock them
  // before the peer is connected, so no transfer pays a page fault (docs/transport.md "Resident
  // memory"). Checked above: each lies inside one shared mapping backed to its last byte.
  for (size_t j = 0; j < peer.spans.size(); ++j) {
    const Peer::Span& sp = peer.spans[j];
    if (sp.local != 0)
      keep_resident(reinterpret_cast<void*>(sp.local), sp.bytes, peer_name(peer.id) + " span " + std::to_string(j),
                    false);
  }
  return Status::Ok();
}

void UcxTransport::on_connect_flushed(void* request, ucs_status_t status, void* user_data) {
  ucp_request_free(request);
  auto* ctx = static_cast<ConnectCtx*>(user_data);
  UcxTransport* self = ctx->owner;
  ctx->requests--;
  if (status != UCS_OK) {
    self->complete_connect(*ctx, ucx_failure("wire-up", status));
  } else if (self->mode_ == WriteMode::kPut) {
    self->complete_connect(*ctx, Status::Ok());
  }  // AM mode: the ping was sent; the peer's ack completes the connect
  self->release_connect_if_idle(*ctx);
}

void UcxTransport::release_connect_if_idle(ConnectCtx& ctx) {
  if (ctx.reply || ctx.requests != 0 || shutting_down_) return;
  connects_.erase(&ctx);
  delete &ctx;
}

void UcxTransport::complete_connect(ConnectCtx& ctx, const Status& status) {
  auto reply = std::move(ctx.reply);
  ctx.reply = nullptr;
  if (!reply) return;  // answered already (timed out)
  if (ctx.ping_token != 0) pings_.erase(ctx.ping_token);
  auto it = peers_.find(ctx.id);
  Peer* peer = it == peers_.end() ? nullptr : it->second.get();
  if (peer != nullptr) peer->connecting = false;
  if (status.ok() && peer != nullptr && peer->state == Peer::State::kLive) {
    peer->wired = true;
    tune_tcp_sockets(ctx.peer_address);  // wired up: UCX's sockets to this peer exist
    return reply(ctx.id);
  }
  Status why = !status.ok() ? status : peer != nullptr ? peer->error : Status();
  reply(Status(ErrorCode::kPeerUnreachable,
               peer_name(ctx.id) + ": connect failed: " + why.message()));
  if (peer != nullptr && !shutting_down_) {
    PeerId id = ctx.id;
    post([this, id] { do_disconnect(id); });  // not from inside a UCX callback
  }
}

void UcxTransport::check_connect_deadlines() {
  auto now = std::chrono::steady_clock::now();
  std::vector<ConnectCtx*> expired;
  for (ConnectCtx* c : connects_) {
    if (c->reply && now >= c->deadline) expired.push_back(c);
  }
  for (ConnectCtx* c : expired) {
    // A request still holding c completes when the disconnect force-closes the endpoint.
    complete_connect(*c, {ErrorCode::kPeerUnreachable, "wire-up timed out"});
    release_connect_if_idle(*c);
  }
}

void UcxTransport::disconnect(PeerId id) {
  post([this, id] { do_disconnect(id); });
}

void UcxTransport::do_disconnect(PeerId id) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  Peer& p = *it->second;
  bool failed = p.state == Peer::State::kFailed;
  if (p.state == Peer::State::kLive) (p.reverse ? reverse_peers_ : live_peers_)--;
  if (!failed) p.error = Status(ErrorCode::kPeerUnreachable, "disconnected");
  p.state = Peer::State::kDisconnected;
  fail_peer_batches(p, {ErrorCode::kTransferError, "disconnected with the write in flight"});
  p.erase_when_closed = true;
  if (p.ep == nullptr) {
    peers_.erase(it);
  } else if (!p.closing) {
    // An endpoint that never wired up is closed by force: a graceful close would flush towards a
    // peer that may never answer, and UCX aborts if the worker is destroyed with that close
    // still pending (docs/transport.md, "Teardown").
    close_peer(p, /*force=*/failed || !p.wired);  // may erase p
  }
}

void UcxTransport::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->owner->handle_ep_error(*peer, status);
}

void UcxTransport::handle_ep_error(Peer& peer, ucs_status_t status) {
  if (peer.state != Peer::State::kLive || shutting_down_) return;
  peer.state = Peer::State::kFailed;
  if (peer.reverse) {
    reverse_peers_--;
    // Nothing was written to it and nobody holds its id: close and forget it.
    log_event(LogLevel::kDebug, "transport", peer_name(peer.id) + " (reverse) endpoint failed: " +
                                                 std::string(ucs_status_string(status)));
    peer.erase_when_closed = true;
    PeerId id = peer.id;
    post([this, id] {
      auto it = peers_.find(id);
      if (it == peers_.end()) return;
      if (it->second->ep == nullptr) {
        peers_.erase(it);
      } else if (!it->second->closing) {
        close_peer(*it->second, /*force=*/true);  // may erase it
      }
    });
    return;
  }
  live_peers_--;
  peer.error = ucx_error(ErrorCode::kPeerUnreachable, "endpoint failed", status);
  fail_peer_batches(peer, peer.error);
  if (peer_error_handler_ && !peer.connecting) {  // a pending connect() reports it instead
    try {
      peer_error_handler_(peer.id, Status(ErrorCode::kPeerUnreachable,
                                          peer_name(peer.id) + ": " + peer.error.message()));
    } catch (...) {
    }
  }
  // UCX wants a failed endpoint closed (force), but not from inside its own error callback.
  PeerId id = peer.id;
  post([this, id] {
    auto it = peers_.find(id);
    if (it != peers_.end() && it->second->ep != nullptr && !it->second->closing) {
      close_peer(*it->second, /*force=*/true);
    }
  });
}

void UcxTransport::close_peer(Peer& peer, bool force) {
  peer.closing = true;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  prm.cb.send = &UcxTransport::on_close_done;
  prm.user_data = &peer;
  void* req = ucp_ep_close_nbx(peer.ep, &prm);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) finish_close(peer);
}

void UcxTransport::on_close_done(void* request, ucs_status_t /*status*/, void* user_data) {
  ucp_request_free(request);
  auto* peer = static_cast<Peer*>(user_data);
  peer->owner->finish_close(*peer);
}

void UcxTransport::finish_close(Peer& peer) {
  peer.ep = nullptr;
  peer.closing = false;
  peer.destroy_rkeys();
  if (peer.erase_when_closed && !shutting_down_) peers_.erase(peer.id);  // last use of peer
}

void UcxTransport::Peer::destroy_rkeys() {
  std::lock_guard<std::mutex> lock(segment_mapping_lock());  // shm_segments.h
  for (Span& s : spans) {
    if (s.rkey != nullptr) ucp_rkey_destroy(s.rkey);
    s.rkey = nullptr;
  }
}

void UcxTransport::set_peer_error_handler(std::function<void(PeerId, Status)> handler) {
  post([this, handler = std::move(handler)] { peer_error_handler_ = handler; });
}

void UcxTransport::set_write_fence(std::shared_ptr<WriteFence> fence) {
  post([this, fence = std::move(fence)] { fence_ = fence; });
}

}  // namespace kvferry::ucx
