// Wire format of the active-message write path (TCP): a write AM carries one op's data with a
// fixed header; the receiver validates the header against ITS OWN registered spans (span_table.h),
// places the data and answers with an ack AM (status code per op). Both sides run on the same machine
// architecture (loopback or one cluster), so headers are host-endian PODs with a magic/version.
// Every write, scatter and ack names its room (the bootstrap_room Transport::write was given), so
// a receiver with a room fence (kvferry/write_fence.h) places a write only into the pages of an
// open room it names (docs/transport.md "Wire format", docs/security.md "The room fence").
// Thread contract: pure functions.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kvferry/error.h"
#include "kvferry/write_fence.h"
#include "transport/ucx/span_table.h"

namespace kvferry::ucx {

inline constexpr unsigned kAmWriteId = 0x4b31;  // ucp AM ids used by this transport
inline constexpr unsigned kAmAckId = 0x4b32;
inline constexpr unsigned kAmPingId = 0x4b33;  // payload AmAck{batch_id = token}; acked
inline constexpr unsigned kAmScatterId = 0x4b34;  // many small writes in one message (below)
// Wire version 2 ("kvf2", 2026-12-04): headers and acks carry the room. A version-1 peer ("kvf1",
// headers without a room) is refused by size and magic, never misread.
inline constexpr uint32_t kAmMagic = 0x6b766632;    // "kvf2"
inline constexpr uint32_t kAmMagicV1 = 0x6b766631;  // "kvf1": refused, named in the error

struct AmWriteHeader {
  uint32_t magic = kAmMagic;
  uint32_t op_index = 0;
  uint64_t batch_id = 0;
  uint64_t room = 0;    // the bootstrap_room of the batch
  uint64_t offset = 0;  // in the receiver's offset space
  uint64_t length = 0;  // bytes; must equal the AM payload length
};
static_assert(sizeof(AmWriteHeader) == 40);

// Why a receiver refused a message (AmAck::refusal); 0 when placed or for other codes.
enum class AmRefusal : uint16_t {
  kNone = 0,
  kSpan = 1,         // malformed, or outside the receiver's registered spans
  kRoomClosed = 2,   // the room fence: the room is not open at the receiver
  kOutsideRoom = 3,  // the room fence: the write touches bytes that are not the room's
};
inline constexpr uint16_t kMaxAmRefusal = 3;

struct AmAck {
  uint32_t magic = kAmMagic;
  uint16_t code = 0;     // ErrorCode wire value; 0 = placed
  uint16_t refusal = 0;  // AmRefusal when code != 0
  uint64_t batch_id = 0;
  uint64_t room = 0;     // the room the acked message named (0 for a ping)
};
static_assert(sizeof(AmAck) == 24);

// Parses and validates a write header against the receiver's own spans. On success fills *out
// and *dst (where the data goes). Errors (kProtocolError): wrong size or magic (a version-1 header
// is named as such), length != payload_length, a range not inside one span. *out.batch_id and
// *out.room are filled whenever the header was readable, so the sender can be told.
Status parse_write_header(const void* header, size_t header_length, size_t payload_length,
                          const SpanTable& spans, AmWriteHeader* out, uint8_t** dst);

// A scatter message packs many small writes of one batch into one AM (so a head-sliced transfer
// is not one message per token row): AM header = AmScatterHeader, payload = `count`
// AmScatterEntry (16 bytes each, host-endian, possibly unaligned), then the entries' data
// back to back in entry order. One ack answers the whole message.
struct AmScatterHeader {
  uint32_t magic = kAmMagic;
  uint32_t count = 0;       // entries
  uint64_t batch_id = 0;
  uint64_t room = 0;        // the bootstrap_room of the batch
  uint64_t data_bytes = 0;  // sum of the entries' lengths
};
static_assert(sizeof(AmScatterHeader) == 32);

struct AmScatterEntry {
  uint64_t offset = 0;  // in the receiver's offset space
  uint64_t length = 0;  // bytes
};

// Limits a receiver enforces (and the sender packs within): they bound the receiver's bounce
// buffer for rendezvous scatter messages. Ops shorter than kScatterMaxOpBytes are packed; longer
// ones go one per message, received straight into the region.
inline constexpr uint32_t kScatterMaxEntries = 4096;
inline constexpr uint64_t kScatterMaxDataBytes = 512ull << 10;
inline constexpr uint64_t kScatterMaxOpBytes = 64ull << 10;
// Sender-side only: at most this many local pieces (and bytes) gathered into one message.
inline constexpr size_t kMaxGatherPieces = 4096;
inline constexpr uint64_t kMaxGatherBytes = 8ull << 20;
inline constexpr uint64_t kScatterMaxPayload =
    kScatterMaxEntries * sizeof(AmScatterEntry) + kScatterMaxDataBytes;

// Checks a scatter AM header against the payload length and the limits above (before any data
// is received). Errors (kProtocolError): wrong size or magic, count 0 or over the limit,
// data_bytes over the limit, payload_length != count * 16 + data_bytes. *out.batch_id and
// *out.room are filled whenever the header was readable.
Status parse_scatter_header(const void* header, size_t header_length, size_t payload_length,
                            AmScatterHeader* out);

// Places a scatter payload (already checked with parse_scatter_header) into the receiver's spans:
// first checks EVERY entry (inside one span, overflow-safe; lengths summing to data_bytes; and,
// given a pin of the room's fence, inside the room's ranges), then copies. On any error nothing is
// written (kProtocolError; *refusal says which check failed: kSpan, or kOutsideRoom).
Status place_scatter(const AmScatterHeader& h, const uint8_t* payload, size_t payload_length,
                     const SpanTable& spans, const WriteFence::Pin* room = nullptr,
                     AmRefusal* refusal = nullptr);

// Parses an ack; false when malformed (wrong size or magic, a refusal code past kMaxAmRefusal).
bool parse_ack(const void* data, size_t length, AmAck* out);

}  // namespace kvferry::ucx
