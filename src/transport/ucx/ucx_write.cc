// UcxTransport: the write path (put + flush over shared memory, active messages + acks over
// TCP) and the writer's handling of acks (the receiver side is ucx_receive.cc). Everything here
// runs on the progress thread.
#include <sodium.h>

#include <memory>
#include <cstring>
#include <string>

#include "transport/ucx/ucx_config.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {
namespace {

std::string range_text(uint64_t offset, uint64_t length) {
  std::string s(1, '[');  // built by appending: GCC 12 warns falsely on "[" + std::string
  s += std::to_string(offset);
  s += ", +";
  s += std::to_string(length);
  s += ')';
  return s;
}

// What the writer says when a receiver refused a message of a batch (AmAck::refusal).
std::string refusal_text(AmRefusal r, uint64_t room) {
  switch (r) {
    case AmRefusal::kRoomClosed:
      return "the receiver's room fence refused the write: room " + std::to_string(room) +
             " is not open there (released, quarantined or never given pages)";
    case AmRefusal::kOutsideRoom:
      return "the receiver's room fence refused the write: it touches bytes outside room " +
             std::to_string(room) + "'s pages there";
    case AmRefusal::kSpan:
    case AmRefusal::kNone:
      break;
  }
  return "peer refused the write (its span check failed)";
}

}  // namespace

std::string UcxTransport::peer_name(PeerId id) const {
  return std::string(transport_name(options_.kind)) + " peer " + std::to_string(id);
}

void UcxTransport::write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
                         std::function<void(Status)> done) {
  auto shared_done = std::make_shared<std::function<void(Status)>>(std::move(done));
  bool posted = post([this, peer, room, ops = std::move(ops), shared_done]() mutable {
    do_write(peer, room, std::move(ops), std::move(*shared_done));
  });
  if (!posted && *shared_done) {
    failed_batches_++;
    (*shared_done)(Status(ErrorCode::kTransferError, peer_name(peer) + ", room " +
                                                         std::to_string(room) +
                                                         ": transport is shut down"));
  }
}

// A batch or ping id is a fresh random 64-bit number (libsodium's CSPRNG), never a counter: an ack
// settles a batch only by its id, which only the receiver of that batch's write header learns, so
// one peer cannot predict the id of a batch meant for another and forge its ack
// (docs/security.md, "Acknowledgements"). Nonzero and unique among this transport's open batches
// and pings.
uint64_t UcxTransport::fresh_batch_id() {
  static const bool sodium_ready = sodium_init() >= 0;  // idempotent and thread-safe
  for (;;) {
    uint64_t id = 0;
    if (sodium_ready) {
      randombytes_buf(&id, sizeof id);
    } else {
      id = next_batch_id_++;  // libsodium could not initialise: unique, but predictable
    }
    if (id != 0 && batches_.count(id) == 0 && pings_.count(id) == 0) return id;
  }
}

void UcxTransport::do_write(PeerId id, uint64_t room, std::vector<WriteOp> ops,
                            std::function<void(Status)> done) {
  auto owned = std::make_unique<Batch>();
  Batch& b = *owned;
  b.owner = this;
  b.id = fresh_batch_id();
  if (hooks_.on_batch_id) hooks_.on_batch_id(b.id);
  b.peer = id;
  b.room = room;
  b.done = std::move(done);
  batches_.emplace(b.id, std::move(owned));
  if (shutting_down_) return finish(b, {ErrorCode::kTransferError, "transport shut down"});
  auto it = peers_.find(id);
  if (it == peers_.end()) return finish(b, {ErrorCode::kPeerUnreachable, "not connected"});
  Peer& p = *it->second;
  if (p.state != Peer::State::kLive) return finish(b, p.error);
  Status valid = validate_ops(p, ops);
  if (!valid.ok()) return finish(b, valid);
  p.batches.insert(b.id);
  if (mode_ == WriteMode::kPut) {
    issue_puts(p, b, ops);
  } else {
    issue_am_writes(p, b, ops);
  }
  recycle_write_ops(std::move(ops));  // issued: nothing refers to the list any more
}

Status UcxTransport::validate_ops(const Peer& peer, const std::vector<WriteOp>& ops) const {
  if (spans_.empty()) {
    return {ErrorCode::kInvalidArgument, "no local memory (create_region or register_spans first)"};
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const WriteOp& op = ops[i];
    if (local_ptr(op.local_offset, op.length) == nullptr) {
      return {ErrorCode::kProtocolError,
              "op " + std::to_string(i) + ": local " + range_text(op.local_offset, op.length) +
                  " not inside one local span (" + spans_.describe() + ")"};
    }
    if (!hooks_.skip_local_bounds_check &&
        find_span(peer.spans, op.remote_offset, op.length) == nullptr) {
      return {ErrorCode::kProtocolError,
              "op " + std::to_string(i) + ": remote " + range_text(op.remote_offset, op.length) +
                  " not inside one of the peer's " + std::to_string(peer.spans.size()) +
                  " spans"};
    }
  }
  return Status::Ok();
}

void UcxTransport::issue_puts(Peer& p, Batch& b, const std::vector<WriteOp>& ops) {
  ucp_request_param_t prm{};  // no callback: the flush below completes after every put
  bool posted = false;        // a put went through UCX (else there is nothing to flush)
  uint64_t copied = 0;        // ops written (copied here or put)
  for (const WriteOp& op : ops) {
    if (op.length == 0) continue;
    const Peer::Span* rs = find_span(p.spans, op.remote_offset, op.length);  // validated
    if (rs->local != 0) {
      // A shared-memory span mapped here, checked and made resident at connect (shm_mapping.h,
      // docs/transport.md "Resident memory"): UCX's put would be this memcpy behind a request and
      // a protocol lookup per op. Copying here costs one memcpy per piece (docs/transport.md
      // "Direct copies"). The op lies inside the span (validate_ops), the span inside the mapping.
      std::memcpy(reinterpret_cast<uint8_t*>(rs->local) + (op.remote_offset - rs->offset),
                  local_ptr(op.local_offset, op.length), op.length);
      ++copied;  // counted once per batch: a locked add per piece would wait for its stores
      b.bytes += op.length;
      continue;
    }
    posted = true;
    void* req = ucp_put_nbx(p.ep, local_ptr(op.local_offset, op.length), op.length,
                            rs->base + (op.remote_offset - rs->offset), rs->rkey, &prm);
    ++copied;
    if (UCS_PTR_IS_ERR(req)) {
      writes_ += copied;
      return finish(b, ucx_failure("put", UCS_PTR_STATUS(req)));
    }
    if (req != nullptr) ucp_request_free(req);  // completes in the background
    b.bytes += op.length;
  }
  writes_ += copied;
  if (b.bytes == 0 || !posted) return finish(b, Status::Ok());
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = &UcxTransport::on_flush_done;
  prm.user_data = &b;
  void* req = ucp_ep_flush_nbx(p.ep, &prm);
  if (req == nullptr) return finish(b, Status::Ok());
  if (UCS_PTR_IS_ERR(req)) return finish(b, ucx_failure("flush", UCS_PTR_STATUS(req)));
  b.requests++;
}

void UcxTransport::on_flush_done(void* request, ucs_status_t status, void* user_data) {
  ucp_request_free(request);
  auto* b = static_cast<Batch*>(user_data);
  b->requests--;
  b->owner->finish(*b, status == UCS_OK ? Status::Ok() : ucx_failure("flush", status));
}

void UcxTransport::issue_am_writes(Peer& p, Batch& b, const std::vector<WriteOp>& ops) {
  // The sends point into these: size them once (upper bounds), never reallocate. Every op is at
  // most one iov, every scatter message adds one more (its entry table).
  b.headers.reserve(ops.size());
  b.entries.reserve(ops.size());
  b.scatter_headers.reserve(ops.size());
  b.iovs.reserve(2 * ops.size());
  b.gather_iovs.reserve(ops.size());
  size_t first_iov = 0, first_entry = 0;
  uint32_t count = 0;
  size_t pieces = 0;
  uint64_t data_bytes = 0;
  for (size_t i = 0; i < ops.size();) {
    if (ops[i].length == 0) {
      ++i;
      continue;
    }
    // [i, j): ops whose remote ranges follow each other inside one remote span, bounded in
    // pieces and bytes (no span: a forged op of the test hook, sent alone).
    size_t j = i + 1;
    uint64_t length = ops[i].length;
    const Peer::Span* rs = find_span(p.spans, ops[i].remote_offset, length);
    while (rs != nullptr && j < ops.size() && j - i < kMaxGatherPieces && ops[j].length > 0 &&
           ops[j].remote_offset == ops[j - 1].remote_offset + ops[j - 1].length &&
           length + ops[j].length <= kMaxGatherBytes &&
           range_fits(ops[i].remote_offset - rs->offset, length + ops[j].length, rs->bytes)) {
      length += ops[j].length;
      ++j;
    }
    if (length >= kScatterMaxOpBytes) {
      if (!send_write(p, b, ops, i, j, length)) return;
      i = j;
      continue;
    }
    if (count > 0 && (count == kScatterMaxEntries || pieces + (j - i) > kMaxGatherPieces ||
                      data_bytes + length > kScatterMaxDataBytes)) {
      if (!send_scatter(p, b, first_iov, first_entry, count, data_bytes)) return;
      count = 0;
      pieces = 0;
      data_bytes = 0;
    }
    if (count == 0) {
      first_iov = b.iovs.size();
      first_entry = b.entries.size();
      b.iovs.push_back({});  // the entry table, filled in by send_scatter
    }
    b.entries.push_back({ops[i].remote_offset, length});
    for (size_t k = i; k < j; ++k) {
      b.iovs.push_back({local_ptr(ops[k].local_offset, ops[k].length), ops[k].length});
    }
    ++count;
    pieces += j - i;
    data_bytes += length;
    i = j;
  }
  if (count > 0 && !send_scatter(p, b, first_iov, first_entry, count, data_bytes)) return;
  if (b.acks == 0) finish(b, Status::Ok());
}

bool UcxTransport::send_write(Peer& p, Batch& b, const std::vector<WriteOp>& ops, size_t first,
                              size_t end, uint64_t length) {
  AmWriteHeader& h = b.headers.emplace_back();
  h.op_index = static_cast<uint32_t>(first);
  h.batch_id = b.id;
  h.room = b.room;
  h.offset = ops[first].remote_offset;
  h.length = length;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = UCP_AM_SEND_FLAG_REPLY | hooks_.am_send_flags;
  prm.cb.send = &UcxTransport::on_am_sent;
  prm.user_data = &b;
  const void* buffer = local_ptr(ops[first].local_offset, ops[first].length);
  size_t count = length;
  if (end - first > 1) {  // gather the local pieces (their own array: a scatter may be open)
    buffer = b.gather_iovs.data() + b.gather_iovs.size();  // reserved: stays valid
    count = end - first;
    for (size_t k = first; k < end; ++k) {
      b.gather_iovs.push_back({local_ptr(ops[k].local_offset, ops[k].length), ops[k].length});
    }
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    prm.datatype = ucp_dt_make_iov();
  }
  void* req = ucp_am_send_nbx(p.ep, kAmWriteId, &h, sizeof(h), buffer, count, &prm);
  writes_++;
  if (UCS_PTR_IS_ERR(req)) {
    finish(b, ucx_failure("am send", UCS_PTR_STATUS(req)));
    return false;
  }
  b.acks++;
  b.bytes += length;
  if (req != nullptr) b.requests++;
  return true;
}

bool UcxTransport::send_scatter(Peer& p, Batch& b, size_t first_iov, size_t first_entry,
                                uint32_t count, uint64_t data_bytes) {
  AmScatterHeader& h = b.scatter_headers.emplace_back();
  h.count = count;
  h.batch_id = b.id;
  h.room = b.room;
  h.data_bytes = data_bytes;
  b.iovs[first_iov] = {&b.entries[first_entry], count * sizeof(AmScatterEntry)};
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
  prm.flags = UCP_AM_SEND_FLAG_REPLY | hooks_.am_send_flags;
  prm.datatype = ucp_dt_make_iov();
  prm.cb.send = &UcxTransport::on_am_sent;
  prm.user_data = &b;
  // This message's iovs are the last ones appended: its table, then its pieces.
  void* req = ucp_am_send_nbx(p.ep, kAmScatterId, &h, sizeof(h), &b.iovs[first_iov],
                              b.iovs.size() - first_iov, &prm);
  writes_++;
  if (UCS_PTR_IS_ERR(req)) {
    finish(b, ucx_failure("am send", UCS_PTR_STATUS(req)));
    return false;
  }
  b.acks++;
  b.bytes += data_bytes;
  if (req != nullptr) b.requests++;
  return true;
}

void UcxTransport::on_am_sent(void* request, ucs_status_t status, void* user_data) {
  ucp_request_free(request);
  auto* b = static_cast<Batch*>(user_data);
  b->requests--;
  if (status != UCS_OK) {
    b->owner->finish(*b, ucx_failure("am send", status));
  } else {
    b->owner->release_if_idle(*b);
  }
}

void UcxTransport::finish(Batch& b, Status status) {
  if (b.finished) return release_if_idle(b);
  b.finished = true;
  auto pit = peers_.find(b.peer);
  if (pit != peers_.end()) pit->second->batches.erase(b.id);
  batches_done_++;
  if (status.ok()) {
    bytes_written_ += b.bytes;
  } else {
    failed_batches_++;
    status = Status(status.code(), peer_name(b.peer) + ", room " + std::to_string(b.room) +
                                       ": " + status.message());
  }
  auto done = std::move(b.done);
  release_if_idle(b);  // may free b
  if (done) {
    try {
      done(std::move(status));
    } catch (...) {  // a throwing callback must not kill the progress thread
    }
  }
}

void UcxTransport::release_if_idle(Batch& b) {
  if (shutting_down_ || !b.finished || b.requests != 0) return;
  batches_.erase(b.id);
}

void UcxTransport::fail_peer_batches(Peer& peer, const Status& status) {
  auto ids = std::move(peer.batches);
  peer.batches.clear();
  for (uint64_t id : ids) {
    auto it = batches_.find(id);
    if (it != batches_.end()) finish(*it->second, status);
  }
}

// An ack settles a ping or batch only if it came back on the endpoint that ping or batch went
// out on: the receiver answers on its reply endpoint with UCP_AM_SEND_FLAG_REPLY, so UCX hands us
// our own endpoint to that receiver. An ack from any other endpoint (another peer that learned or
// guessed an id), or without one, or naming another room than the batch's, is counted and
// dropped (docs/security.md, "Acknowledgements").
bool UcxTransport::ack_is_from(ucp_ep_h from, PeerId peer, uint64_t ack_room, uint64_t room) {
  auto it = peers_.find(peer);
  if (from != nullptr && it != peers_.end() && it->second->ep == from && ack_room == room) {
    return true;
  }
  foreign_acks_.fetch_add(1);
  return false;
}

void UcxTransport::handle_am_ack(const void* data, size_t length, ucp_ep_h from) {
  AmAck ack;
  if (!parse_ack(data, length, &ack)) return;
  if (auto ping = pings_.find(ack.batch_id); ping != pings_.end()) {
    ConnectCtx& ctx = *ping->second;  // complete_connect erases the map entry
    if (!ack_is_from(from, ctx.id, ack.room, 0)) return;
    complete_connect(ctx, ack.code == 0 ? Status::Ok()
                                        : Status(ErrorCode::kPeerUnreachable, "ping refused"));
    return release_connect_if_idle(ctx);
  }
  auto it = batches_.find(ack.batch_id);
  if (it == batches_.end() || it->second->finished) return;  // already failed: ignore
  Batch& b = *it->second;
  if (!ack_is_from(from, b.peer, ack.room, b.room)) return;
  if (ack.code != 0) {
    ErrorCode code = code_from_int(ack.code).value_or(ErrorCode::kProtocolError);
    return finish(b, {code, refusal_text(static_cast<AmRefusal>(ack.refusal), b.room)});
  }
  if (--b.acks == 0) finish(b, Status::Ok());
}

}  // namespace kvferry::ucx
