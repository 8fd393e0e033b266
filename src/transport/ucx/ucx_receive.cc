// UcxTransport: the receiver side of the active-message write path (tcp): the AM handlers, the
// span checks, the room fence (kvferry/write_fence.h; docs/security.md "The room fence") and the
// acks. Everything here runs on the progress thread.
#include <cstring>
#include <memory>
#include <string>

#include "kvferry/log.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {
namespace {

AmRefusal refusal_of(FenceVerdict v) {
  return v == FenceVerdict::kRoomClosed ? AmRefusal::kRoomClosed : AmRefusal::kOutsideRoom;
}

// A room that is not open is no attack (a late write of a room the receiver has given up): the
// writer's batch fails, which changes nothing for a room that failed already. Bytes outside an
// open room's pages are a writer's bug or a liar: protocol_error.
ErrorCode code_of(FenceVerdict v) {
  return v == FenceVerdict::kRoomClosed ? ErrorCode::kTransferError : ErrorCode::kProtocolError;
}

}  // namespace

Status UcxTransport::register_am_handlers() {
  struct Handler {
    unsigned id;
    ucp_am_recv_callback_t cb;
  };
  for (Handler h : {Handler{kAmWriteId, &UcxTransport::am_write_cb},
                    Handler{kAmScatterId, &UcxTransport::am_scatter_cb},
                    Handler{kAmAckId, &UcxTransport::am_ack_cb},
                    Handler{kAmPingId, &UcxTransport::am_ping_cb}}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = h.id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = h.cb;
    hp.arg = this;
    ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (s != UCS_OK) {
      return {ErrorCode::kInternal,
              std::string("ucp_worker_set_am_recv_handler: ") + ucs_status_string(s)};
    }
  }
  return Status::Ok();
}

WriteFence::Pin UcxTransport::fence_pin(uint64_t room, uint64_t offset, uint64_t length,
                                        bool check_range, FenceVerdict* verdict) {
  *verdict = FenceVerdict::kAdmitted;
  if (!fence_) return {};
  WriteFence::Pin pin = fence_->pin(room);
  if (!pin) {
    *verdict = FenceVerdict::kRoomClosed;
  } else if (check_range && !pin.contains(offset, length)) {
    *verdict = FenceVerdict::kOutsideRoom;
    pin.release();
  }
  if (*verdict != FenceVerdict::kAdmitted) count_fence_refusal(*verdict, room, offset, length);
  return pin;
}

// Counted on both the transport and the fence; one log line per kind per kFenceLogIntervalNs at
// most, naming the latest refusal and how many there were since the last line of that kind. A
// closed room's refusal is debug: it is the expected end of a failed room's late writes (the
// room's failure is its one line above debug; docs/failure-model.md "Room fence"). Bytes outside
// a room are a peer's lie: warning.
void UcxTransport::count_fence_refusal(FenceVerdict v, uint64_t room, uint64_t offset,
                                       uint64_t length) {
  fence_refusals_.fetch_add(1);
  if (fence_) fence_->count_refusal(v);
  const int k = v == FenceVerdict::kOutsideRoom ? 1 : 0;
  ++fence_unlogged_[k];
  const int64_t now = monotonic_ns();
  if (fence_logged_ns_[k] != 0 && now - fence_logged_ns_[k] < kFenceLogIntervalNs) return;
  fence_logged_ns_[k] = now;
  log_event(k == 1 ? LogLevel::kWarning : LogLevel::kDebug, "transport.fence",
            "room fence refused " + std::to_string(fence_unlogged_[k]) +
                " incoming write(s) since the last such line; latest [" + std::to_string(offset) +
                ", +" + std::to_string(length) + "): " + fence_verdict_name(v) +
                " (nothing written, the writer is told)",
            {.room = room});
  fence_unlogged_[k] = 0;
}

ucs_status_t UcxTransport::am_write_cb(void* arg, const void* header, size_t header_length,
                                       void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  return static_cast<UcxTransport*>(arg)->handle_am_write(header, header_length, data, length,
                                                          param);
}

ucs_status_t UcxTransport::handle_am_write(const void* header, size_t header_length, void* data,
                                           size_t length, const ucp_am_recv_param_t* param) {
  ucp_ep_h reply_ep =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  AmWriteHeader h;
  uint8_t* dst = nullptr;
  // The one check that keeps a remote peer inside our registered spans (our table, not its claim).
  Status st = parse_write_header(header, header_length, length, spans_, &h, &dst);
  if (!st.ok()) {
    rejected_incoming_++;
    send_ack(reply_ep, h.batch_id, h.room, ErrorCode::kProtocolError, AmRefusal::kSpan);
    return UCS_OK;  // drops the data (eager) or the rendezvous descriptor
  }
  // The room fence: only into the pages of the open room the write names. The pin is held until
  // the bytes are in place, so the endpoint knows when a closed room's last placement is done.
  FenceVerdict verdict;
  WriteFence::Pin pin = fence_pin(h.room, h.offset, h.length, /*check_range=*/true, &verdict);
  if (verdict != FenceVerdict::kAdmitted) {
    send_ack(reply_ep, h.batch_id, h.room, code_of(verdict), refusal_of(verdict));
    return UCS_OK;
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    if (length > 0) std::memcpy(dst, data, length);
    pin.release();
    send_ack(reply_ep, h.batch_id, h.room, ErrorCode::kOk);
    return UCS_OK;
  }
  auto* ctx = new RecvCtx{};
  ctx->owner = this;
  ctx->reply_ep = reply_ep;
  ctx->batch_id = h.batch_id;
  ctx->room = h.room;
  ctx->pin = std::move(pin);
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.recv_am = &UcxTransport::on_recv_done;
  prm.user_data = ctx;
  void* req = ucp_am_recv_data_nbx(worker_, data, dst, length, &prm);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) {
    send_ack(reply_ep, h.batch_id, h.room,
             req == nullptr ? ErrorCode::kOk : ErrorCode::kTransferError);
    delete ctx;  // releases the pin
  } else {
    recvs_.insert(ctx);
  }
  return UCS_OK;
}

ucs_status_t UcxTransport::am_scatter_cb(void* arg, const void* header, size_t header_length,
                                         void* data, size_t length,
                                         const ucp_am_recv_param_t* param) {
  return static_cast<UcxTransport*>(arg)->handle_am_scatter(header, header_length, data, length,
                                                            param);
}

std::unique_ptr<uint8_t[]> UcxTransport::take_bounce() {
  if (bounce_free_.empty()) return std::make_unique_for_overwrite<uint8_t[]>(kScatterMaxPayload);
  auto buf = std::move(bounce_free_.back());
  bounce_free_.pop_back();
  return buf;
}

void UcxTransport::return_bounce(std::unique_ptr<uint8_t[]> buf) {
  constexpr size_t kKeep = 8;  // enough for the rendezvous receives one peer keeps in flight
  if (buf && bounce_free_.size() < kKeep) bounce_free_.push_back(std::move(buf));
}

// Places a received scatter payload: the room fence's pin is taken here, at placement, so a room
// closed while the payload was on its way is refused; every entry is checked (spans, then the
// room's ranges) before anything is copied. Returns the ack's code and refusal.
ErrorCode UcxTransport::place_scatter_payload(const AmScatterHeader& h, const uint8_t* payload,
                                              size_t length, AmRefusal* refusal) {
  *refusal = AmRefusal::kNone;
  FenceVerdict verdict;
  WriteFence::Pin pin = fence_pin(h.room, 0, 0, /*check_range=*/false, &verdict);
  if (verdict != FenceVerdict::kAdmitted) {
    *refusal = refusal_of(verdict);
    return code_of(verdict);
  }
  Status st = place_scatter(h, payload, length, spans_, fence_ ? &pin : nullptr, refusal);
  if (st.ok()) return ErrorCode::kOk;
  if (*refusal == AmRefusal::kOutsideRoom) {
    uint64_t offset = 0, bytes = 0;  // for the log line: the first entry
    if (length >= sizeof(AmScatterEntry)) {
      AmScatterEntry e;
      std::memcpy(&e, payload, sizeof e);
      offset = e.offset;
      bytes = e.length;
    }
    count_fence_refusal(FenceVerdict::kOutsideRoom, h.room, offset, bytes);
  } else {
    rejected_incoming_++;
  }
  return ErrorCode::kProtocolError;
}

ucs_status_t UcxTransport::handle_am_scatter(const void* header, size_t header_length,
                                             void* data, size_t length,
                                             const ucp_am_recv_param_t* param) {
  ucp_ep_h reply_ep =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  AmScatterHeader h;
  // Header first (bounds the bounce buffer), then every entry inside place_scatter: together
  // they keep a remote peer inside our registered spans.
  Status st = parse_scatter_header(header, header_length, length, &h);
  if (!st.ok() || spans_.empty()) {
    rejected_incoming_++;
    send_ack(reply_ep, h.batch_id, h.room, ErrorCode::kProtocolError, AmRefusal::kSpan);
    return UCS_OK;
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    AmRefusal refusal;
    ErrorCode code = place_scatter_payload(h, static_cast<const uint8_t*>(data), length, &refusal);
    send_ack(reply_ep, h.batch_id, h.room, code, refusal);
    return UCS_OK;
  }
  if (fence_ && !fence_->is_open(h.room)) {  // not worth receiving: refused now, counted once
    FenceVerdict verdict;
    fence_pin(h.room, 0, 0, /*check_range=*/false, &verdict);
    if (verdict != FenceVerdict::kAdmitted) {
      send_ack(reply_ep, h.batch_id, h.room, code_of(verdict), refusal_of(verdict));
      return UCS_OK;
    }
  }
  auto* ctx = new RecvCtx{};
  ctx->owner = this;
  ctx->reply_ep = reply_ep;
  ctx->batch_id = h.batch_id;
  ctx->room = h.room;
  ctx->scatter = true;
  ctx->scatter_header = h;
  ctx->length = length;
  ctx->bounce = take_bounce();
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.recv_am = &UcxTransport::on_recv_done;
  prm.user_data = ctx;
  void* req = ucp_am_recv_data_nbx(worker_, data, ctx->bounce.get(), length, &prm);
  if (req == nullptr) {  // received at once
    on_recv_done(nullptr, UCS_OK, length, ctx);
  } else if (UCS_PTR_IS_ERR(req)) {
    send_ack(reply_ep, h.batch_id, h.room, ErrorCode::kTransferError);
    return_bounce(std::move(ctx->bounce));
    delete ctx;
  } else {
    recvs_.insert(ctx);
  }
  return UCS_OK;
}

void UcxTransport::on_recv_done(void* request, ucs_status_t status, size_t /*length*/,
                                void* user_data) {
  if (request != nullptr) ucp_request_free(request);
  auto* ctx = static_cast<RecvCtx*>(user_data);
  UcxTransport* self = ctx->owner;
  self->recvs_.erase(ctx);
  ctx->pin.release();  // a write's bytes are in place (or will never come)
  // On failure the sender is usually gone (its reply ep with it); its own error fails the batch.
  if (status == UCS_OK) {
    ErrorCode code = ErrorCode::kOk;
    AmRefusal refusal = AmRefusal::kNone;
    if (ctx->scatter) {
      code = self->place_scatter_payload(ctx->scatter_header, ctx->bounce.get(), ctx->length,
                                         &refusal);
    }
    self->send_ack(ctx->reply_ep, ctx->batch_id, ctx->room, code, refusal);
  }
  self->return_bounce(std::move(ctx->bounce));
  delete ctx;
}

void UcxTransport::send_ack(ucp_ep_h reply_ep, uint64_t batch_id, uint64_t room, ErrorCode code,
                            AmRefusal refusal, bool ping) {
  if (reply_ep == nullptr || (hooks_.suppress_acks && !ping) || shutting_down_) return;
  auto* msg = new AckMsg{};
  msg->owner = this;
  msg->ack.batch_id = batch_id;
  msg->ack.room = room;
  msg->ack.code = static_cast<uint16_t>(code);
  msg->ack.refusal = code == ErrorCode::kOk ? 0 : static_cast<uint16_t>(refusal);
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
  // REPLY: the writer learns which of its endpoints the ack came back on (handle_am_ack).
  prm.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  prm.cb.send = &UcxTransport::on_ack_sent;
  prm.user_data = msg;
  void* req = ucp_am_send_nbx(reply_ep, kAmAckId, nullptr, 0, &msg->ack, sizeof(msg->ack), &prm);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) {
    delete msg;  // sent at once, or the sender is gone (its ep error fails the batch there)
  } else {
    acks_in_flight_.insert(msg);
  }
}

void UcxTransport::on_ack_sent(void* request, ucs_status_t /*status*/, void* user_data) {
  ucp_request_free(request);
  auto* msg = static_cast<AckMsg*>(user_data);
  msg->owner->acks_in_flight_.erase(msg);
  delete msg;
}

ucs_status_t UcxTransport::am_ack_cb(void* arg, const void* /*header*/, size_t /*header_length*/,
                                     void* data, size_t length,
                                     const ucp_am_recv_param_t* param) {
  ucp_ep_h from =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  static_cast<UcxTransport*>(arg)->handle_am_ack(data, length, from);
  return UCS_OK;
}

ucs_status_t UcxTransport::am_ping_cb(void* arg, const void* /*header*/,
                                      size_t /*header_length*/, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  AmAck ping;
  if (parse_ack(data, length, &ping) && (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    static_cast<UcxTransport*>(arg)->send_ack(param->reply_ep, ping.batch_id, 0, ErrorCode::kOk,
                                              AmRefusal::kNone, /*ping=*/true);
  }
  return UCS_OK;
}

}  // namespace kvferry::ucx
