// Control-plane messages between prefill and decode ranks (carried over ZeroMQ, src/control).
//
// Frame format (all integers little-endian):
//   magic "KVFY" (4 bytes) | version u16 (=1) | type u16 | body_length u32 | body
// Body fields are fixed-width integers and length-prefixed byte strings (u32 length + bytes).
// decode() checks magic, version, type, that body_length equals the rest of the frame, that every
// string and array fits the body, enum values are in range, counts are bounded, and that nothing
// is left over. A frame that fails any check is rejected with kProtocolError and a message naming
// the field; decode() never throws and never reads outside the input.
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvferry/error.h"
#include "kvferry/poll.h"

namespace kvferry {

constexpr uint16_t kProtocolVersion = 1;
constexpr uint32_t kMaxKvIndices = 1u << 24;    // pages per room per message
constexpr uint32_t kMaxStringBytes = 1u << 16;  // any string field

enum class MessageType : uint16_t {
  kPoolRegistration = 1,
  kRoomMetadata = 2,
  kRoomStatus = 3,
  kHeartbeat = 4,
};

// decode -> prefill, once per connection: where and how to write into the decode rank's pool.
struct PoolRegistration {
  RankId sender;                 // the decode rank
  std::string control_endpoint;  // decode rank's ZeroMQ endpoint, e.g. "tcp://127.0.0.1:5601"
  std::string worker_address;    // transport address (opaque)
  std::string packed_rkey;       // transport remote key (opaque)
  uint64_t region_base = 0;
  uint64_t region_bytes = 0;
  uint32_t page_size = 0;        // tokens
  uint64_t page_bytes = 0;       // bytes of one page in one buffer
  uint64_t num_pages = 0;        // pages per buffer
  uint32_t num_buffers = 0;
  uint32_t aux_slots = 0;
  uint32_t heads_per_rank = 0;
  uint32_t first_head = 0;
};

// decode -> prefill, per room: the destination pages and aux slot.
struct RoomMetadata {
  uint64_t room = 0;
  RankId sender;                    // the decode rank
  std::vector<uint64_t> kv_indices; // destination pages, in token order
  uint32_t aux_slot = 0;
  uint32_t expected_senders = 0;    // prefill ranks that will write to this decode rank
};

// Either direction, per room: a final state with its cause. Success carries kOk.
// prefill -> decode: Success after flush, or Failed; decode -> prefill: Failed (failure or abort).
// `terminal` false (prefill -> decode, Failed only) is an early notice: the room failed, but
// writes of the sender may still land in the receiver's pages; a terminal Failed follows once
// they drained (or the sender dies, or the receiver's drain deadline passes). On the wire it is
// an optional trailing flags byte, present only when not terminal, so terminal frames are
// unchanged from earlier builds.
struct RoomStatus {
  uint64_t room = 0;
  RankId sender;
  KVPoll state = KVPoll::Failed;
  ErrorCode code = ErrorCode::kOk;
  RankId origin;                    // where the failure was first observed as a local fact
  int64_t first_seen_ns = 0;
  std::string reason;
  bool terminal = true;             // false: early failure notice, writes may still land
};

struct Heartbeat {
  RankId sender;
  uint64_t seq = 0;
  int64_t sent_ns = 0;
};

using Message = std::variant<PoolRegistration, RoomMetadata, RoomStatus, Heartbeat>;

std::string encode(const Message& m);
Result<Message> decode(std::string_view frame);
std::string_view message_name(const Message& m);

}  // namespace kvferry
