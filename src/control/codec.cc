// encode()/decode() of control frames (include/kvferry/messages.h).
//
// Header (12 bytes): "KVFY" | version u16 | type u16 | body_length u32. Bodies, fields in order:
//   RankId           role u8 (0 prefill, 1 decode) | engine_id u32 | tp_rank u32 | dp_rank u32
//   Compat           u32 count (<= kMaxCompatFields) + count * (name str | value str)  (kvferry/compat.h)
//   PoolRegistration sender RankId | compat Compat | incarnation u64 | peer_incarnation u64 | control_endpoint str | worker_address str |
//                    spans (u32 count + count * (offset u64 | bytes u64 | base u64 | packed_rkey str)) |
//                    page_size u32 | page_bytes u64 | num_pages u64 | kv_offsets u64[] |
//                    aux_offsets u64[] | aux_item_bytes u64[] | aux_rows u64 |
//                    state_offsets u64[] | state_item_bytes u64[] | state_rows u64 |
//                    guard_offset u64 | heads_per_rank u32 | first_head u32
//   RoomMetadata     room u64 | sender RankId | incarnation u64 | peer_incarnation u64 | kv_indices u64[] | aux_index u64 |
//                    state_indices u64[] | expected_senders u32 [| flags u8]
//                    flags is present only when not 0: exactly kFlagIntegrity (bit 0), the room's
//                    integrity digest is asked for; absent means it is not (the original format).
// u64[] = u32 count + count * u64.
//   Failure          code u16 (ErrorCode) | origin RankId | first_seen_ns i64 | wall_ns i64 |
//                    reason str   (the failure record's one binary piece, kvferry/error.h)
//   RoomStatus       room u64 | sender RankId | incarnation u64 | peer_incarnation u64 | state u8 (KVPoll) | failure Failure
//                    [| flags u8 [| digest u64]]
//                    flags is present only when not 0, with no bit but kFlagNotTerminal (bit 0: a
//                    non-terminal status, state Failed) or kFlagDigest (bit 1: the integrity digest
//                    follows, state Success, terminal); absent means terminal without a digest (the
//                    original format).
//   Heartbeat        sender RankId | incarnation u64 | seq u64 | sent_ns i64 [| probe u8 | nonce u64]
//                    [| renew u8 (=3) | rooms u64[]] [| leaving u8 (=4)]
//                    the optional tail: probe 1 = a challenge, 2 = its answer, nonce not 0;
//                    absent means neither (the original format). Then, optionally, the renewed
//                    rooms (1 to kMaxRenewRooms, no room twice); absent means none. Then,
//                    optionally, the leaving tag, last (the sender shuts down in order).
//   RegistrationRefusal sender RankId | incarnation u64 | peer_incarnation u64 | failure Failure (code not kOk)
// A sender incarnation of 0 is refused (every rank has one, messages.h).
// str = u32 length (<= kMaxStringBytes) + bytes. A RoomStatus must be terminal and consistent:
// Success with kOk, or Failed with a non-ok code; a non-terminal one must be Failed. encode() truncates an over-long RoomStatus
// reason to kMaxStringBytes (free text; the status itself must reach the peer).
#include <algorithm>
#include <string>
#include <type_traits>

#include "control/wire.h"
#include "kvferry/messages.h"

namespace kvferry {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'F', 'Y'};
constexpr size_t kHeaderBytes = 12;
constexpr size_t kBodyLengthOffset = 8;
constexpr uint8_t kFlagNotTerminal = 1;  // RoomStatus flags: an early failure notice
constexpr uint8_t kFlagDigest = 2;       // RoomStatus flags: the integrity digest follows
constexpr uint8_t kFlagIntegrity = 1;    // RoomMetadata flags: the digest is asked for
constexpr uint8_t kProbeChallenge = 1;   // Heartbeat tail: a challenge
constexpr uint8_t kProbeAnswer = 2;      // Heartbeat tail: the answer to one
constexpr uint8_t kRenewTag = 3;         // Heartbeat tail: the renewed rooms follow
constexpr uint8_t kLeavingTag = 4;       // Heartbeat tail, last: the sender is leaving

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
MessageType type_of(const RegistrationRefusal&) { return MessageType::kRegistrationRefusal; }

// The sender's incarnation, which must not be 0 (messages.h).
void get_incarnation(WireReader& r, const char* field, uint64_t* v) {
  if (r.u64(field, v) && *v == 0) r.fail(field, "is 0 (every rank has an incarnation)");
}

void put_compat(WireWriter& w, const Compat& c) {
  w.u32(static_cast<uint32_t>(c.size()));
  for (const CompatField& f : c) {
    w.bytes(f.name);
    w.bytes(f.value);
  }
}

// Parsed whole and bounded (kvferry/compat.h) before anything reads a field of it.
void get_compat(WireReader& r, const char* field, Compat* c) {
  uint32_t n = 0;
  if (!r.u32(field, &n)) return;
  // Each field takes at least 8 bytes (two lengths): a count the body cannot hold fails first.
  if (n > kMaxCompatFields || r.remaining() / 8 < n)
    return r.fail(field, std::to_string(n) + " fields, expected at most " + std::to_string(kMaxCompatFields));
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    CompatField f;
    r.bytes(field, kMaxCompatNameBytes, &f.name);
    r.bytes(field, kMaxCompatValueBytes, &f.value);
    c->push_back(std::move(f));
  }
  if (!r.ok()) return;
  if (std::string why = compat_bounds_error(*c); !why.empty()) r.fail(field, why);
}

void put_body(WireWriter& w, const PoolRegistration& m) {
  put_rank(w, m.sender);
  put_compat(w, m.compat);
  w.u64(m.incarnation);
  w.u64(m.peer_incarnation);
  w.bytes(m.control_endpoint);
  w.bytes(m.worker_address);
  w.u32(static_cast<uint32_t>(m.spans.size()));
  for (const RegionSpan& s : m.spans) {
    w.u64(s.offset);
    w.u64(s.bytes);
    w.u64(s.base);
    w.bytes(s.packed_rkey);
  }
  w.u32(m.page_size);
  w.u64(m.page_bytes);
  w.u64(m.num_pages);
  w.u64_array(m.kv_offsets);
  w.u64_array(m.aux_offsets);
  w.u64_array(m.aux_item_bytes);
  w.u64(m.aux_rows);
  w.u64_array(m.state_offsets);
  w.u64_array(m.state_item_bytes);
  w.u64(m.state_rows);
  w.u64(m.guard_offset);
  w.u32(m.heads_per_rank);
  w.u32(m.first_head);
}

void put_body(WireWriter& w, const RoomMetadata& m) {
  w.u64(m.room);
  put_rank(w, m.sender);
  w.u64(m.incarnation);
  w.u64(m.peer_incarnation);
  w.u64_array(m.kv_indices);
  w.u64(m.aux_index);
  w.u64_array(m.state_indices);
  w.u32(m.expected_senders);
  if (m.integrity) w.u8(kFlagIntegrity);
}

void put_failure(WireWriter& w, const Failure& f) {
  w.u16(static_cast<uint16_t>(f.code));
  put_rank(w, f.origin);
  w.i64(f.first_seen_ns);
  w.i64(f.wall_ns);
  std::string_view reason = f.reason;
  w.bytes(reason.substr(0, kMaxStringBytes));
}

// Reads a Failure as put_failure() wrote it; `what` prefixes the field names ("RoomStatus").
// The code must be a known ErrorCode (kOk included: the caller checks it against its state).
void get_failure(WireReader& r, const std::string& what, Failure* f) {
  uint16_t code = 0;
  const std::string code_field = what + ".code";
  if (r.u16(code_field.c_str(), &code)) {
    auto c = code_from_int(code);
    if (!c) r.fail(code_field.c_str(), std::to_string(code) + " is not an ErrorCode value");
    else f->code = *c;
  }
  get_rank(r, (what + ".origin").c_str(), &f->origin);
  r.i64((what + ".first_seen_ns").c_str(), &f->first_seen_ns);
  r.i64((what + ".wall_ns").c_str(), &f->wall_ns);
  r.bytes((what + ".reason").c_str(), kMaxStringBytes, &f->reason);
}

void put_body(WireWriter& w, const RoomStatus& m) {
  w.u64(m.room);
  put_rank(w, m.sender);
  w.u64(m.incarnation);
  w.u64(m.peer_incarnation);
  w.u8(static_cast<uint8_t>(m.state));
  put_failure(w, m.failure);
  const uint8_t flags = static_cast<uint8_t>((m.terminal ? 0 : kFlagNotTerminal) | (m.digest ? kFlagDigest : 0));
  if (flags != 0) w.u8(flags);
  if (m.digest) w.u64(*m.digest);
}

void put_body(WireWriter& w, const Heartbeat& m) {
  put_rank(w, m.sender);
  w.u64(m.incarnation);
  w.u64(m.seq);
  w.i64(m.sent_ns);
  if (m.challenge != 0 || m.answer != 0) {
    w.u8(m.challenge != 0 ? kProbeChallenge : kProbeAnswer);
    w.u64(m.challenge != 0 ? m.challenge : m.answer);
  }
  if (!m.renew_rooms.empty()) {
    w.u8(kRenewTag);
    w.u32(static_cast<uint32_t>(m.renew_rooms.size()));
    for (uint64_t room : m.renew_rooms) w.u64(room);
  }
  if (m.leaving) w.u8(kLeavingTag);
}

void put_body(WireWriter& w, const RegistrationRefusal& m) {
  put_rank(w, m.sender);
  w.u64(m.incarnation);
  w.u64(m.peer_incarnation);
  put_failure(w, m.failure);
}

// A u64 that must not be zero.
void get_positive(WireReader& r, const char* field, uint64_t* v) {
  if (r.u64(field, v) && *v == 0) r.fail(field, "is 0");
}

// A u64 array whose entries must not be zero.
void get_positive_array(WireReader& r, const char* field, uint32_t max_count, std::vector<uint64_t>* v) {
  if (!r.u64_array(field, max_count, v)) return;
  for (size_t i = 0; i < v->size(); ++i)
    if ((*v)[i] == 0) return r.fail(field, "entry " + std::to_string(i) + " is 0");
}

void get_body(WireReader& r, PoolRegistration* m) {
  get_rank(r, "PoolRegistration.sender", &m->sender);
  get_compat(r, "PoolRegistration.compat", &m->compat);
  get_incarnation(r, "PoolRegistration.incarnation", &m->incarnation);
  r.u64("PoolRegistration.peer_incarnation", &m->peer_incarnation);
  r.bytes("PoolRegistration.control_endpoint", kMaxStringBytes, &m->control_endpoint);
  r.bytes("PoolRegistration.worker_address", kMaxStringBytes, &m->worker_address);
  uint32_t spans = 0;
  if (r.u32("PoolRegistration.spans", &spans)) {
    if (spans == 0 || spans > kMaxRegionSpans) {
      r.fail("PoolRegistration.spans", std::to_string(spans) + " spans, expected 1.." + std::to_string(kMaxRegionSpans));
    } else {
      // Each span takes at least 28 bytes: a count the body cannot hold fails before allocating.
      if (r.remaining() / 28 < spans) r.fail("PoolRegistration.spans", std::to_string(spans) + " spans do not fit the body");
      for (uint32_t i = 0; i < spans && r.ok(); ++i) {
        RegionSpan s;
        r.u64("PoolRegistration.spans.offset", &s.offset);
        get_positive(r, "PoolRegistration.spans.bytes", &s.bytes);
        r.u64("PoolRegistration.spans.base", &s.base);
        r.bytes("PoolRegistration.spans.packed_rkey", kMaxStringBytes, &s.packed_rkey);
        if (r.ok() && s.offset > UINT64_MAX - s.bytes) r.fail("PoolRegistration.spans", "offset + bytes overflows");
        m->spans.push_back(std::move(s));
      }
    }
  }
  if (r.u32("PoolRegistration.page_size", &m->page_size) && m->page_size == 0)
    r.fail("PoolRegistration.page_size", "is 0");
  get_positive(r, "PoolRegistration.page_bytes", &m->page_bytes);
  get_positive(r, "PoolRegistration.num_pages", &m->num_pages);
  if (r.u64_array("PoolRegistration.kv_offsets", kMaxKvBuffers, &m->kv_offsets) && m->kv_offsets.empty())
    r.fail("PoolRegistration.kv_offsets", "no KV buffer");
  r.u64_array("PoolRegistration.aux_offsets", kMaxAuxBuffers, &m->aux_offsets);
  get_positive_array(r, "PoolRegistration.aux_item_bytes", kMaxAuxBuffers, &m->aux_item_bytes);
  if (r.ok() && m->aux_item_bytes.size() != m->aux_offsets.size())
    r.fail("PoolRegistration.aux_item_bytes", std::to_string(m->aux_item_bytes.size()) + " entries for " +
                                                  std::to_string(m->aux_offsets.size()) + " aux buffers");
  get_positive(r, "PoolRegistration.aux_rows", &m->aux_rows);
  r.u64_array("PoolRegistration.state_offsets", kMaxStateBuffers, &m->state_offsets);
  get_positive_array(r, "PoolRegistration.state_item_bytes", kMaxStateBuffers, &m->state_item_bytes);
  if (r.ok() && m->state_item_bytes.size() != m->state_offsets.size())
    r.fail("PoolRegistration.state_item_bytes", std::to_string(m->state_item_bytes.size()) + " entries for " +
                                                    std::to_string(m->state_offsets.size()) + " state buffers");
  if (r.u64("PoolRegistration.state_rows", &m->state_rows) && m->state_rows == 0 && !m->state_offsets.empty())
    r.fail("PoolRegistration.state_rows", "is 0 with state buffers");
  r.u64("PoolRegistration.guard_offset", &m->guard_offset);
  if (r.u32("PoolRegistration.heads_per_rank", &m->heads_per_rank) && m->heads_per_rank == 0)
    r.fail("PoolRegistration.heads_per_rank", "is 0");
  r.u32("PoolRegistration.first_head", &m->first_head);
  if (r.ok() && m->first_head > UINT32_MAX - m->heads_per_rank)
    r.fail("PoolRegistration.first_head", "first_head + heads_per_rank overflows");
}

void get_body(WireReader& r, RoomMetadata* m, uint32_t max_kv_indices) {
  r.u64("RoomMetadata.room", &m->room);
  get_rank(r, "RoomMetadata.sender", &m->sender);
  get_incarnation(r, "RoomMetadata.incarnation", &m->incarnation);
  r.u64("RoomMetadata.peer_incarnation", &m->peer_incarnation);
  r.u64_array("RoomMetadata.kv_indices", std::min(max_kv_indices, kMaxKvIndices), &m->kv_indices);
  r.u64("RoomMetadata.aux_index", &m->aux_index);
  r.u64_array("RoomMetadata.state_indices", kMaxStateIndices, &m->state_indices);
  r.u32("RoomMetadata.expected_senders", &m->expected_senders);
  if (r.ok() && r.remaining() > 0) {  // the optional flags byte
    uint8_t flags = 0;
    if (r.u8("RoomMetadata.flags", &flags)) {
      if (flags != kFlagIntegrity)
        r.fail("RoomMetadata.flags", std::to_string(flags) + " is not " + std::to_string(kFlagIntegrity) +
                                         " (integrity; absent means none)");
      else
        m->integrity = true;
    }
  }
}

void get_body(WireReader& r, RoomStatus* m) {
  r.u64("RoomStatus.room", &m->room);
  get_rank(r, "RoomStatus.sender", &m->sender);
  get_incarnation(r, "RoomStatus.incarnation", &m->incarnation);
  r.u64("RoomStatus.peer_incarnation", &m->peer_incarnation);
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
  get_failure(r, "RoomStatus", &m->failure);
  if (r.ok() && (m->state == KVPoll::Success) != (m->failure.code == ErrorCode::kOk)) {
    r.fail("RoomStatus.code", std::to_string(static_cast<int>(m->failure.code)) + " contradicts state " +
                                  std::string(to_string(m->state)) + " (Success carries ok, Failed a non-ok code)");
  }
  if (r.ok() && r.remaining() > 0) {  // the optional flags byte (and digest)
    uint8_t flags = 0;
    if (r.u8("RoomStatus.flags", &flags)) {
      if (flags != kFlagNotTerminal && flags != kFlagDigest) {
        r.fail("RoomStatus.flags", std::to_string(flags) + " is not " + std::to_string(kFlagNotTerminal) +
                                       " (not terminal) or " + std::to_string(kFlagDigest) +
                                       " (digest); absent means terminal without a digest");
      } else if (flags == kFlagNotTerminal && m->state != KVPoll::Failed) {
        r.fail("RoomStatus.flags", "a non-terminal status must be Failed, not " +
                                       std::string(to_string(m->state)));
      } else if (flags == kFlagDigest && m->state != KVPoll::Success) {
        r.fail("RoomStatus.flags", "a digest goes with Success only, not " + std::string(to_string(m->state)));
      } else if (flags == kFlagNotTerminal) {
        m->terminal = false;
      } else {
        uint64_t digest = 0;
        if (r.u64("RoomStatus.digest", &digest)) m->digest = digest;
      }
    }
  }
}

void get_body(WireReader& r, Heartbeat* m) {
  get_rank(r, "Heartbeat.sender", &m->sender);
  get_incarnation(r, "Heartbeat.incarnation", &m->incarnation);
  r.u64("Heartbeat.seq", &m->seq);
  r.i64("Heartbeat.sent_ns", &m->sent_ns);
  // The optional tail, each part at most once and in this order: probe, renewal, leaving.
  uint8_t tag = 0;
  auto next_tag = [&](const char* field) {
    tag = 0;
    if (r.ok() && r.remaining() > 0) r.u8(field, &tag);
  };
  next_tag("Heartbeat.probe");
  if (r.ok() && (tag == kProbeChallenge || tag == kProbeAnswer)) {  // the optional challenge or answer
    uint64_t nonce = 0;
    r.u64("Heartbeat.nonce", &nonce);
    if (!r.ok()) return;
    if (nonce == 0) return r.fail("Heartbeat.nonce", "is 0");
    (tag == kProbeChallenge ? m->challenge : m->answer) = nonce;
    next_tag("Heartbeat.renew");
    if (r.ok() && tag != 0 && tag != kRenewTag && tag != kLeavingTag)
      return r.fail("Heartbeat.renew", std::to_string(tag) + " is neither the renewal tag (3) nor the leaving tag (4)");
  }
  if (!r.ok() || tag == 0) return;
  if (tag == kRenewTag) {
    uint32_t n = 0;
    r.u32("Heartbeat.renew_rooms", &n);
    if (!r.ok()) return;
    if (n == 0 || n > kMaxRenewRooms)
      return r.fail("Heartbeat.renew_rooms", std::to_string(n) + " rooms (1 to " + std::to_string(kMaxRenewRooms) + ")");
    if (r.remaining() < static_cast<size_t>(n) * 8)
      return r.fail("Heartbeat.renew_rooms", std::to_string(n) + " rooms do not fit the body");
    m->renew_rooms.resize(n);
    for (uint64_t& room : m->renew_rooms) r.u64("Heartbeat.renew_rooms", &room);
    std::vector<uint64_t> sorted = m->renew_rooms;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      return r.fail("Heartbeat.renew_rooms", "names a room twice");
    next_tag("Heartbeat.leaving");
    if (r.ok() && tag != 0 && tag != kLeavingTag)
      return r.fail("Heartbeat.leaving", std::to_string(tag) + " is not the leaving tag (4)");
    if (!r.ok() || tag == 0) return;
  }
  if (tag != kLeavingTag)
    return r.fail("Heartbeat.probe", std::to_string(tag) +
                                         " is neither a challenge (1), an answer (2), the renewal tag (3) nor the "
                                         "leaving tag (4)");
  m->leaving = true;  // last: anything after it is left over (refused by decode())
}

void get_body(WireReader& r, RegistrationRefusal* m) {
  get_rank(r, "RegistrationRefusal.sender", &m->sender);
  get_incarnation(r, "RegistrationRefusal.incarnation", &m->incarnation);
  r.u64("RegistrationRefusal.peer_incarnation", &m->peer_incarnation);
  get_failure(r, "RegistrationRefusal", &m->failure);
  if (r.ok() && m->failure.code == ErrorCode::kOk) r.fail("RegistrationRefusal.code", "is ok (a refusal has a cause)");
}

template <typename T>
Result<Message> decode_body(std::string_view body, const char* name, uint32_t max_kv_indices) {
  WireReader r(body);
  T m;
  if constexpr (std::is_same_v<T, RoomMetadata>) get_body(r, &m, max_kv_indices);
  else get_body(r, &m);
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

Result<Message> decode(std::string_view frame) { return decode(frame, kMaxKvIndices); }

std::optional<RankId> frame_sender(std::string_view frame) {
  if (frame.size() < kHeaderBytes || frame.substr(0, 4) != std::string_view(kMagic, sizeof(kMagic))) return std::nullopt;
  WireReader h(frame.substr(4, kHeaderBytes - 4));
  uint16_t version = 0, type = 0;
  h.u16("version", &version);
  h.u16("type", &type);
  if (!h.ok() || version != kProtocolVersion) return std::nullopt;
  WireReader r(frame.substr(kHeaderBytes));
  uint64_t room = 0;
  switch (static_cast<MessageType>(type)) {
    case MessageType::kRoomMetadata:
    case MessageType::kRoomStatus:
      r.u64("room", &room);  // the room comes first, the sender after it
      break;
    case MessageType::kPoolRegistration:
    case MessageType::kHeartbeat:
    case MessageType::kRegistrationRefusal:
      break;
    default:
      return std::nullopt;
  }
  RankId sender;
  get_rank(r, "sender", &sender);
  if (!r.ok()) return std::nullopt;
  return sender;
}

std::optional<Result<Compat>> frame_compat(std::string_view frame) {
  if (frame.size() < kHeaderBytes || frame.substr(0, 4) != std::string_view(kMagic, sizeof(kMagic))) return std::nullopt;
  WireReader h(frame.substr(4, kHeaderBytes - 4));
  uint16_t version = 0, type = 0;
  h.u16("version", &version);
  h.u16("type", &type);
  if (!h.ok() || version != kProtocolVersion || type != static_cast<uint16_t>(MessageType::kPoolRegistration))
    return std::nullopt;
  WireReader r(frame.substr(kHeaderBytes));
  RankId sender;
  get_rank(r, "PoolRegistration.sender", &sender);
  Compat c;
  get_compat(r, "PoolRegistration.compat", &c);
  if (!r.ok()) return Result<Compat>(bad(r.error()));
  return Result<Compat>(std::move(c));
}

Result<Message> decode(std::string_view frame, uint32_t max_kv_indices) {
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
      return decode_body<PoolRegistration>(body, "PoolRegistration", max_kv_indices);
    case MessageType::kRoomMetadata:
      return decode_body<RoomMetadata>(body, "RoomMetadata", max_kv_indices);
    case MessageType::kRoomStatus:
      return decode_body<RoomStatus>(body, "RoomStatus", max_kv_indices);
    case MessageType::kHeartbeat:
      return decode_body<Heartbeat>(body, "Heartbeat", max_kv_indices);
    case MessageType::kRegistrationRefusal:
      return decode_body<RegistrationRefusal>(body, "RegistrationRefusal", max_kv_indices);
  }
  return bad("type: " + std::to_string(type) + " is not a known message type");
}

std::string_view message_name(const Message& m) {
  struct Name {
    std::string_view operator()(const PoolRegistration&) const { return "PoolRegistration"; }
    std::string_view operator()(const RoomMetadata&) const { return "RoomMetadata"; }
    std::string_view operator()(const RoomStatus&) const { return "RoomStatus"; }
    std::string_view operator()(const Heartbeat&) const { return "Heartbeat"; }
    std::string_view operator()(const RegistrationRefusal&) const { return "RegistrationRefusal"; }
  };
  return std::visit(Name{}, m);
}

}  // namespace kvferry
