// encode()/decode() of control frames (include/kvferry/messages.h).
//
// Header (12 bytes): "KVFY" | version u16 | type u16 | body_length u32. Bodies, fields in order:
//   RankId           role u8 (0 prefill, 1 decode) | engine_id u32 | tp_rank u32 | dp_rank u32
//   PoolRegistration sender RankId | control_endpoint str | worker_address str | packed_rkey str |
//                    region_base u64 | region_bytes u64 | page_size u32 | page_bytes u64 |
//                    num_pages u64 | num_buffers u32 | aux_slots u32 | heads_per_rank u32 |
//                    first_head u32
//   RoomMetadata     room u64 | sender RankId | kv_indices (u32 count + count * u64) |
//                    aux_slot u32 | expected_senders u32
//   RoomStatus       room u64 | sender RankId | state u8 (KVPoll) | code u16 (ErrorCode) |
//                    origin RankId | first_seen_ns i64 | reason str [| flags u8]
//                    flags is present only for a non-terminal status: exactly kFlagNotTerminal
//                    (bit 0), with state Failed; absent means terminal (the original format).
//   Heartbeat        sender RankId | seq u64 | sent_ns i64
// str = u32 length (<= kMaxStringBytes) + bytes. A RoomStatus must be terminal and consistent:
// Success with kOk, or Failed with a non-ok code; a non-terminal one must be Failed. encode() truncates an over-long RoomStatus
// reason to kMaxStringBytes (free text; the status itself must reach the peer).
#include <string>

#include "control/wire.h"
#include "kvferry/messages.h"

namespace kvferry {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'F', 'Y'};
constexpr size_t kHeaderBytes = 12;
constexpr size_t kBodyLengthOffset = 8;
constexpr uint8_t kFlagNotTerminal = 1;  // RoomStatus flags: an early failure notice

using wire::WireReader;
using wire::WireWriter;

void put_rank(WireWriter& w, const RankId& r) {
  w.u8(static_cast<uint8_t>(r.role));
  w.u32(r.engine_id);
  w.u32(r.tp_rank);
  w.u32(r.dp_rank);
}

void get_rank(WireReader& r, const char* field, RankId* out) {
  uint8_t role = 0;
  if (r.u8(field, &role) && role > static_cast<uint8_t>(Role::kDecode)) {
    r.fail(field, "role " + std::to_string(role) + " is not a Role (0 prefill, 1 decode)");
  }
  out->role = static_cast<Role>(role);
  r.u32(field, &out->engine_id);
  r.u32(field, &out->tp_rank);
  r.u32(field, &out->dp_rank);
}

MessageType type_of(const PoolRegistration&) { return MessageType::kPoolRegistration; }
MessageType type_of(const RoomMetadata&) { return MessageType::kRoomMetadata; }
MessageType type_of(const RoomStatus&) { return MessageType::kRoomStatus; }
MessageType type_of(const Heartbeat&) { return MessageType::kHeartbeat; }

void put_body(WireWriter& w, const PoolRegistration& m) {
  put_rank(w, m.sender);
  w.bytes(m.control_endpoint);
  w.bytes(m.worker_address);
  w.bytes(m.packed_rkey);
  w.u64(m.region_base);
  w.u64(m.region_bytes);
  w.u32(m.page_size);
  w.u64(m.page_bytes);
  w.u64(m.num_pages);
  w.u32(m.num_buffers);
  w.u32(m.aux_slots);
  w.u32(m.heads_per_rank);
  w.u32(m.first_head);
}

void put_body(WireWriter& w, const RoomMetadata& m) {
  w.u64(m.room);
  put_rank(w, m.sender);
  w.u64_array(m.kv_indices);
  w.u32(m.aux_slot);
  w.u32(m.expected_senders);
}

void put_body(WireWriter& w, const RoomStatus& m) {
  w.u64(m.room);
  put_rank(w, m.sender);
  w.u8(static_cast<uint8_t>(m.state));
  w.u16(static_cast<uint16_t>(m.code));
  put_rank(w, m.origin);
  w.i64(m.first_seen_ns);
  std::string_view reason = m.reason;
  w.bytes(reason.substr(0, kMaxStringBytes));
  if (!m.terminal) w.u8(kFlagNotTerminal);
}

void put_body(WireWriter& w, const Heartbeat& m) {
  put_rank(w, m.sender);
  w.u64(m.seq);
  w.i64(m.sent_ns);
}

void get_body(WireReader& r, PoolRegistration* m) {
  get_rank(r, "PoolRegistration.sender", &m->sender);
  r.bytes("PoolRegistration.control_endpoint", kMaxStringBytes, &m->control_endpoint);
  r.bytes("PoolRegistration.worker_address", kMaxStringBytes, &m->worker_address);
  r.bytes("PoolRegistration.packed_rkey", kMaxStringBytes, &m->packed_rkey);
  r.u64("PoolRegistration.region_base", &m->region_base);
  r.u64("PoolRegistration.region_bytes", &m->region_bytes);
  r.u32("PoolRegistration.page_size", &m->page_size);
  r.u64("PoolRegistration.page_bytes", &m->page_bytes);
  r.u64("PoolRegistration.num_pages", &m->num_pages);
  r.u32("PoolRegistration.num_buffers", &m->num_buffers);
  r.u32("PoolRegistration.aux_slots", &m->aux_slots);
  r.u32("PoolRegistration.heads_per_rank", &m->heads_per_rank);
  r.u32("PoolRegistration.first_head", &m->first_head);
}

void get_body(WireReader& r, RoomMetadata* m) {
  r.u64("RoomMetadata.room", &m->room);
  get_rank(r, "RoomMetadata.sender", &m->sender);
  r.u64_array("RoomMetadata.kv_indices", kMaxKvIndices, &m->kv_indices);
  r.u32("RoomMetadata.aux_slot", &m->aux_slot);
  r.u32("RoomMetadata.expected_senders", &m->expected_senders);
}

void get_body(WireReader& r, RoomStatus* m) {
  r.u64("RoomStatus.room", &m->room);
  get_rank(r, "RoomStatus.sender", &m->sender);
  uint8_t state = 0;
  if (r.u8("RoomStatus.state", &state)) {
    auto p = poll_from_int(state);
    if (!p) {
      r.fail("RoomStatus.state", std::to_string(state) + " is not a KVPoll value");
    } else if (*p != KVPoll::Success && *p != KVPoll::Failed) {
      r.fail("RoomStatus.state", std::to_string(state) + " is not terminal (Success or Failed)");
    } else {
      m->state = *p;
    }
  }
  uint16_t code = 0;
  if (r.u16("RoomStatus.code", &code)) {
    auto c = code_from_int(code);
    if (!c) {
      r.fail("RoomStatus.code", std::to_string(code) + " is not an ErrorCode value");
    } else if ((m->state == KVPoll::Success) != (*c == ErrorCode::kOk)) {
      r.fail("RoomStatus.code", std::to_string(code) + " contradicts state " +
                                    std::string(to_string(m->state)) +
                                    " (Success carries ok, Failed a non-ok code)");
    } else {
      m->code = *c;
    }
  }
  get_rank(r, "RoomStatus.origin", &m->origin);
  r.i64("RoomStatus.first_seen_ns", &m->first_seen_ns);
  r.bytes("RoomStatus.reason", kMaxStringBytes, &m->reason);
  if (r.ok() && r.remaining() > 0) {  // the optional flags byte
    uint8_t flags = 0;
    if (r.u8("RoomStatus.flags", &flags)) {
      if (flags != kFlagNotTerminal) {
        r.fail("RoomStatus.flags", std::to_string(flags) + " is not " + std::to_string(kFlagNotTerminal) +
                                       " (not terminal; absent means terminal)");
      } else if (m->state != KVPoll::Failed) {
        r.fail("RoomStatus.flags", "a non-terminal status must be Failed, not " +
                                       std::string(to_string(m->state)));
      } else {
        m->terminal = false;
      }
    }
  }
}

void get_body(WireReader& r, Heartbeat* m) {
  get_rank(r, "Heartbeat.sender", &m->sender);
  r.u64("Heartbeat.seq", &m->seq);
  r.i64("Heartbeat.sent_ns", &m->sent_ns);
}

template <typename T>
Result<Message> decode_body(std::string_view body, const char* name) {
  WireReader r(body);
  T m;
  get_body(r, &m);
  if (r.ok() && r.remaining() != 0) {
    r.fail("frame", std::to_string(r.remaining()) + " trailing bytes after the " +
                        std::string(name) + " body");
  }
  if (!r.ok()) return Status(ErrorCode::kProtocolError, "control frame: " + r.error());
  return Message(std::move(m));
}

Status bad(const std::string& what) {
  return Status(ErrorCode::kProtocolError, "control frame: " + what);
}

}  // namespace

std::string encode(const Message& m) {
  WireWriter w;
  std::visit(
      [&w](const auto& msg) {
        w.raw(std::string_view(kMagic, sizeof(kMagic)));
        w.u16(kProtocolVersion);
        w.u16(static_cast<uint16_t>(type_of(msg)));
        w.u32(0);  // body_length, patched below
        put_body(w, msg);
      },
      m);
  w.patch_u32(kBodyLengthOffset, static_cast<uint32_t>(w.size() - kHeaderBytes));
  return w.take();
}

Result<Message> decode(std::string_view frame) {
  if (frame.empty()) return bad("empty frame");
  if (frame.size() < kHeaderBytes) {
    return bad("header: " + std::to_string(frame.size()) + " bytes, shorter than the " +
               std::to_string(kHeaderBytes) + "-byte header");
  }
  if (frame.substr(0, 4) != std::string_view(kMagic, sizeof(kMagic))) {
    return bad("magic: not \"KVFY\"");
  }
  WireReader h(frame.substr(4, kHeaderBytes - 4));
  uint16_t version = 0, type = 0;
  uint32_t body_length = 0;
  h.u16("version", &version);
  h.u16("type", &type);
  h.u32("body_length", &body_length);
  if (!h.ok()) return bad(h.error());
  if (version != kProtocolVersion) {
    return bad("version: " + std::to_string(version) + ", expected " +
               std::to_string(kProtocolVersion));
  }
  const std::string_view body = frame.substr(kHeaderBytes);
  if (body_length != body.size()) {
    return bad("body_length: header says " + std::to_string(body_length) +
               " bytes, the frame carries " + std::to_string(body.size()));
  }
  switch (static_cast<MessageType>(type)) {
    case MessageType::kPoolRegistration:
      return decode_body<PoolRegistration>(body, "PoolRegistration");
    case MessageType::kRoomMetadata:
      return decode_body<RoomMetadata>(body, "RoomMetadata");
    case MessageType::kRoomStatus:
      return decode_body<RoomStatus>(body, "RoomStatus");
    case MessageType::kHeartbeat:
      return decode_body<Heartbeat>(body, "Heartbeat");
  }
  return bad("type: " + std::to_string(type) + " is not a known message type");
}

std::string_view message_name(const Message& m) {
  struct Name {
    std::string_view operator()(const PoolRegistration&) const { return "PoolRegistration"; }
    std::string_view operator()(const RoomMetadata&) const { return "RoomMetadata"; }
    std::string_view operator()(const RoomStatus&) const { return "RoomStatus"; }
    std::string_view operator()(const Heartbeat&) const { return "Heartbeat"; }
  };
  return std::visit(Name{}, m);
}

}  // namespace kvferry
