// Control-plane messages between prefill and decode ranks (carried over ZeroMQ, src/control).
//
// Frame format (all integers little-endian):
//   magic "KVFY" (4 bytes) | version u16 (=kProtocolVersion) | type u16 | body_length u32 | body
// Body fields are fixed-width integers and length-prefixed byte strings (u32 length + bytes).
// decode() checks magic, version, type, that body_length equals the rest of the frame, that every
// string and array fits the body, enum values are in range, counts are bounded, and that nothing
// is left over. A frame that fails any check is rejected with kProtocolError and a message naming
// the field; decode() never throws and never reads outside the input.
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvferry/buffers.h"
#include "kvferry/compat.h"
#include "kvferry/error.h"
#include "kvferry/poll.h"

namespace kvferry {

// 2: engine-shaped memory (PoolRegistration spans and buffer offsets, RoomMetadata aux_index and
// state_indices). 3: RoomStatus carries the failure record with its wall_ns (kvferry/error.h).
// 4: every message carries the sender's incarnation, and the ones about rooms the incarnation of
// the receiver they are meant for (below). 5: PoolRegistration carries the decode rank's
// compatibility fingerprint right after its sender (kvferry/compat.h). 6: a Heartbeat may carry
// the rooms whose bootstrap deadline decode renews (Heartbeat::renew_rooms). 7: a Heartbeat may
// say that its sender is leaving (Heartbeat::leaving: an orderly shutdown).
constexpr uint16_t kProtocolVersion = 7;
constexpr uint32_t kMaxKvIndices = 1u << 24;    // pages per room per message
constexpr uint32_t kMaxStringBytes = 1u << 16;  // any string field
constexpr uint32_t kMaxStateIndices = 1u << 12; // state rows per room
constexpr uint32_t kMaxRenewRooms = 1u << 10;   // rooms renewed per Heartbeat
constexpr uint32_t kMaxRegionSpans = kMaxKvBuffers + kMaxAuxBuffers + kMaxStateBuffers + 1;  // + guard rows

// Incarnations (docs/design.md §10: a rank restarted on the same address is a new peer). Each
// rank draws its incarnation once, when its manager is created: the CLOCK_REALTIME ns of its
// start, made unique within the process (EndpointCore::incarnation()), never 0, so a later
// incarnation of a rank has a larger one. Every message carries `incarnation`, the sender's;
// a message about a room or a pool (PoolRegistration, RoomMetadata, RoomStatus) also carries
// `peer_incarnation`, the incarnation of the receiver it is meant for as the sender knows it
// (0: not known, e.g. from an older bootstrap service). A receiver refuses and counts a message
// whose sender incarnation is older than the one it knows for that rank (stale), or whose
// peer_incarnation is not its own (meant for an earlier incarnation of itself); a newer sender
// incarnation is a restart of that peer, believed by a prefill rank only from a registration and
// once the old incarnation is gone (docs/failure-model.md, "Incarnations"). The fields are
// each struct's last, so code that builds messages positionally stays valid; on the wire they
// follow `sender`.

enum class MessageType : uint16_t {
  kPoolRegistration = 1,
  kRoomMetadata = 2,
  kRoomStatus = 3,
  kHeartbeat = 4,
  kRegistrationRefusal = 5,
};

// One span of the decode rank's registered memory, as its transport registered it
// (kvferry/transport.h RemoteSpan): `offset` in the rank's offset space, `base` its address there.
struct RegionSpan {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t base = 0;
  std::string packed_rkey;  // opaque
};

// decode -> prefill, once per connection: where and how to write into the decode rank's memory.
// The shape (kvferry/buffers.h): KV buffer b's page p is at kv_offsets[b] + p * page_bytes; aux
// buffer a's row r at aux_offsets[a] + r * aux_item_bytes[a]; state buffer s's row r at
// state_offsets[s] + r * state_item_bytes[s]; kvferry's guard row r at guard_offset + r *
// kAuxSlotBytes (aux_rows guard rows, one per aux index). Offsets are in the rank's offset space,
// each buffer inside one of `spans` (a contiguous pool is one span holding every buffer).
// decode() checks the structure (counts within their bounds, one item_bytes per aux/state
// buffer, nothing zero that sizes a buffer); the prefill rank checks the rest against its own
// shape and the transfer plan before use (prefill_endpoint.cc check_registration).
struct PoolRegistration {
  RankId sender;                 // the decode rank
  std::string control_endpoint;  // decode rank's ZeroMQ endpoint, e.g. "tcp://127.0.0.1:5601"
  std::string worker_address;    // transport address (opaque)
  std::vector<RegionSpan> spans; // 1..kMaxRegionSpans
  uint32_t page_size = 0;        // tokens, > 0
  uint64_t page_bytes = 0;       // bytes of one page in one KV buffer, > 0
  uint64_t num_pages = 0;        // pages per KV buffer, > 0
  std::vector<uint64_t> kv_offsets;        // 1..kMaxKvBuffers (the number of KV buffers)
  std::vector<uint64_t> aux_offsets;       // 0..kMaxAuxBuffers
  std::vector<uint64_t> aux_item_bytes;    // one per aux buffer, each > 0
  uint64_t aux_rows = 0;                   // aux indices (guard rows), > 0
  std::vector<uint64_t> state_offsets;     // 0..kMaxStateBuffers
  std::vector<uint64_t> state_item_bytes;  // one per state buffer, each > 0
  uint64_t state_rows = 0;                 // > 0 when there are state buffers
  uint64_t guard_offset = 0;
  uint32_t heads_per_rank = 0;   // KV heads of the decode rank's slice, > 0
  uint32_t first_head = 0;       // global index of its first head
  uint64_t incarnation = 0;      // the decode rank's
  uint64_t peer_incarnation = 0; // the prefill rank's, from its bootstrap entry (0: not known)
  // The decode rank's compatibility fingerprint (kvferry/compat.h). On the wire it follows
  // `sender`, so a prefill rank reads and checks it (frame_compat) before any other field.
  Compat compat;
};

// decode -> prefill, per room: the destination pages, aux row and state rows.
struct RoomMetadata {
  uint64_t room = 0;
  RankId sender;                       // the decode rank
  std::vector<uint64_t> kv_indices;    // destination pages, in token order (<= kMaxKvIndices)
  uint64_t aux_index = 0;              // decode's row in every aux buffer and its guard row
  std::vector<uint64_t> state_indices; // decode's rows in every state buffer (<= kMaxStateIndices)
  uint32_t expected_senders = 0;       // prefill ranks that will write to this decode rank
  uint64_t incarnation = 0;            // the decode rank's
  uint64_t peer_incarnation = 0;       // the prefill rank's it registered with (0: not known)
  // The decode rank verifies the room (ManagerConfig::integrity): the prefill rank's Success
  // must carry its digest of what it wrote to this rank (RoomStatus::digest). On the wire an
  // optional trailing flags byte, present only when set, so other frames are unchanged.
  bool integrity = false;
};

// Either direction, per room: a final state with its cause. Success carries kOk.
// prefill -> decode: Success after flush, or Failed; decode -> prefill: Failed (failure or abort).
// `terminal` false (prefill -> decode, Failed only) is an early notice: the room failed, but
// writes of the sender may still land in the receiver's pages; a terminal Failed follows once
// they drained (or the sender dies, or the receiver's drain deadline passes). On the wire it is
// an optional trailing flags byte, present only when not terminal, so terminal frames are
// unchanged from earlier builds.
// `failure` is the one failure record (kvferry/error.h), with code kOk on Success.
struct RoomStatus {
  uint64_t room = 0;
  RankId sender;
  KVPoll state = KVPoll::Failed;
  Failure failure{ErrorCode::kOk, {}, "", 0, 0};
  bool terminal = true;             // false: early failure notice, writes may still land
  uint64_t incarnation = 0;         // the sender's
  uint64_t peer_incarnation = 0;    // the receiver's as the sender knows it (0: not known)
  // prefill -> decode, Success only, when the room's metadata asked for it (RoomMetadata::
  // integrity): the digest of every byte this prefill rank wrote for the room to the receiver
  // (endpoint/integrity.h). On the wire a flags bit plus u64 after the failure record.
  std::optional<uint64_t> digest;
};

// A heartbeat may carry a challenge or its answer (at most one of the two is non-zero): a rank
// that holds a peer's restart claim sends a challenge (a random nonce) to the control endpoint the
// peer's known incarnation registered; whoever owns that endpoint answers with a heartbeat of its
// own incarnation echoing the nonce, sent to the challenger's known control endpoint. Only the
// owner of the endpoint sees the nonce, so the answer says which incarnation lives there
// (docs/security.md, "Incarnations").
//
// Lease renewal (decode -> prefill, docs/manager.md "Renewal"): `renew_rooms` names rooms the
// decode rank has init()ed but not sent metadata for yet (its engine has no pages for them yet);
// the prefill rank moves each one's bootstrap deadline to bootstrap_timeout from now, for a room it
// holds in Bootstrapping whose destination the sender is, never past renew_limit after the
// room's opening. At most kMaxRenewRooms, no room twice; such a heartbeat is sent by the decode
// rank's main thread every renew_interval (kvferry/deadlines.h), so it also says that thread is alive.
struct Heartbeat {
  RankId sender;
  uint64_t seq = 0;
  int64_t sent_ns = 0;
  uint64_t incarnation = 0;  // the sender's
  uint64_t challenge = 0;    // non-zero: answer with this nonce
  uint64_t answer = 0;       // non-zero: the nonce of the challenge this heartbeat answers
  std::vector<uint64_t> renew_rooms;  // decode -> prefill: rooms whose bootstrap deadline is renewed
  // The sender's last heartbeat: it is shutting down in order (its manager is closed). A peer with
  // no room in flight with it forgets it without a failure or a line above info; rooms it still
  // feeds fail as for any lost peer (docs/failure-model.md, "Leaving").
  bool leaving = false;
};

// prefill -> decode, once per pool registration the prefill rank refuses (prefill_registration.cc:
// check_registration, or a transport address it cannot use): why. `failure` (code protocol_error,
// origin the prefill rank, stamped when it refused) is the record the decode rank's rooms for this
// prefill rank fail with, so both engines name one root cause (docs/failure-model.md). decode()
// requires a non-ok code.
struct RegistrationRefusal {
  RankId sender;  // the prefill rank
  Failure failure{ErrorCode::kProtocolError, {}, "", 0, 0};
  uint64_t incarnation = 0;       // the prefill rank's
  uint64_t peer_incarnation = 0;  // the decode rank's whose registration it refuses
};

using Message = std::variant<PoolRegistration, RoomMetadata, RoomStatus, Heartbeat, RegistrationRefusal>;

std::string encode(const Message& m);
Result<Message> decode(std::string_view frame);
// The same, refusing a RoomMetadata with more than `max_kv_indices` page indices (what the
// receiving rank's rooms can have: its pool's pages) before anything is allocated for them.
Result<Message> decode(std::string_view frame, uint32_t max_kv_indices);
// The sender of a frame, read from its header and first fields only (nothing allocated, nothing
// else checked): what a rank refuses a frame from before decoding it (docs/security.md). nullopt:
// not a frame of this protocol version (decode() says why).
std::optional<RankId> frame_sender(std::string_view frame);
// The compatibility fingerprint of a PoolRegistration frame, read from its header, sender and
// fingerprint only (kvferry/compat.h; nothing after it is parsed): nullopt when the frame is no
// PoolRegistration of this protocol version, an error (kProtocolError) when the fingerprint is
// malformed or beyond its bounds.
std::optional<Result<Compat>> frame_compat(std::string_view frame);
std::string_view message_name(const Message& m);

}  // namespace kvferry
