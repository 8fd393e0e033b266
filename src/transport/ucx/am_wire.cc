#include "transport/ucx/am_wire.h"

#include <cstring>
#include <string>

namespace kvferry::ucx {
namespace {

// A header of the wrong size or magic; names a version-1 peer ("kvf1": no room in its headers).
Status bad_header(const char* what, const void* header, size_t header_length, size_t want) {
  uint32_t magic = 0;
  if (header != nullptr && header_length >= sizeof(magic)) std::memcpy(&magic, header, sizeof(magic));
  std::string msg = what;
  if (magic == kAmMagicV1) {
    msg += ": wire version 1 (kvf1) from an older peer, this rank speaks version 2 (kvf2)";
  } else if (header_length != want) {
    msg += " of " + std::to_string(header_length) + " bytes, expected " + std::to_string(want);
  } else {
    msg += ": bad magic";
  }
  return {ErrorCode::kProtocolError, msg};
}

// "scatter entry I [OFFSET, +LENGTH)", the start of a refused entry's reason (built by appending:
// GCC 12 warns falsely on "[" + std::string).
std::string entry_text(uint32_t i, const AmScatterEntry& e) {
  std::string msg = "scatter entry ";
  msg += std::to_string(i);
  msg += " [";
  msg += std::to_string(e.offset);
  msg += ", +";
  msg += std::to_string(e.length);
  msg += ')';
  return msg;
}

}  // namespace

Status parse_write_header(const void* header, size_t header_length, size_t payload_length,
                          const SpanTable& spans, AmWriteHeader* out, uint8_t** dst) {
  *out = AmWriteHeader{};
  *dst = nullptr;
  out->magic = 0;
  if (header == nullptr || header_length != sizeof(AmWriteHeader)) {
    return bad_header("write header", header, header_length, sizeof(AmWriteHeader));
  }
  std::memcpy(out, header, sizeof(AmWriteHeader));
  if (out->magic != kAmMagic) {
    return bad_header("write header", header, header_length, sizeof(AmWriteHeader));
  }
  if (out->length != payload_length) {
    return {ErrorCode::kProtocolError, "write header length " + std::to_string(out->length) +
                                           " != payload " + std::to_string(payload_length)};
  }
  *dst = spans.resolve(out->offset, out->length);
  if (*dst == nullptr) {
    std::string msg = "write [";  // appended piecewise: GCC 12 warns falsely on "x" + string
    msg += std::to_string(out->offset);
    msg += ", +";
    msg += std::to_string(out->length);
    msg += ") not inside one registered span (";
    msg += spans.describe();
    msg += ')';
    return {ErrorCode::kProtocolError, msg};
  }
  return Status::Ok();
}

Status parse_scatter_header(const void* header, size_t header_length, size_t payload_length,
                            AmScatterHeader* out) {
  *out = AmScatterHeader{};
  out->magic = 0;
  if (header == nullptr || header_length != sizeof(AmScatterHeader)) {
    return bad_header("scatter header", header, header_length, sizeof(AmScatterHeader));
  }
  std::memcpy(out, header, sizeof(AmScatterHeader));
  if (out->magic != kAmMagic) {
    return bad_header("scatter header", header, header_length, sizeof(AmScatterHeader));
  }
  if (out->count == 0 || out->count > kScatterMaxEntries) {
    return {ErrorCode::kProtocolError,
            "scatter of " + std::to_string(out->count) + " entries (1.." +
                std::to_string(kScatterMaxEntries) + " allowed)"};
  }
  if (out->data_bytes > kScatterMaxDataBytes) {
    return {ErrorCode::kProtocolError,
            "scatter of " + std::to_string(out->data_bytes) + " data bytes (limit " +
                std::to_string(kScatterMaxDataBytes) + ")"};
  }
  // Both terms are bounded above, so the sum cannot overflow.
  const uint64_t want = uint64_t(out->count) * sizeof(AmScatterEntry) + out->data_bytes;
  if (payload_length != want) {
    return {ErrorCode::kProtocolError, "scatter payload of " + std::to_string(payload_length) +
                                           " bytes, header says " + std::to_string(want)};
  }
  return Status::Ok();
}

Status place_scatter(const AmScatterHeader& h, const uint8_t* payload, size_t payload_length,
                     const SpanTable& spans, const WriteFence::Pin* room, AmRefusal* refusal) {
  AmRefusal ignored;
  if (refusal == nullptr) refusal = &ignored;
  *refusal = AmRefusal::kSpan;
  const uint64_t table = uint64_t(h.count) * sizeof(AmScatterEntry);
  if (payload == nullptr || spans.empty() || h.count == 0 || h.count > kScatterMaxEntries ||
      payload_length != table + h.data_bytes) {
    return {ErrorCode::kProtocolError, "scatter payload does not match its header"};
  }
  uint64_t sum = 0;
  for (uint32_t i = 0; i < h.count; ++i) {  // every entry is checked before anything is written
    AmScatterEntry e;
    std::memcpy(&e, payload + uint64_t(i) * sizeof(e), sizeof(e));
    if (spans.resolve(e.offset, e.length) == nullptr) {
      std::string msg = entry_text(i, e);
      msg += " not inside one registered span (";
      msg += spans.describe();
      msg += ')';
      return {ErrorCode::kProtocolError, msg};
    }
    if (room != nullptr && !room->contains(e.offset, e.length)) {
      *refusal = AmRefusal::kOutsideRoom;
      std::string msg = entry_text(i, e);
      msg += " is not inside the pages of room ";
      msg += std::to_string(h.room);
      return {ErrorCode::kProtocolError, msg};
    }
    if (e.length > h.data_bytes - sum) {  // overflow-safe: sum <= data_bytes holds here
      return {ErrorCode::kProtocolError,
              "scatter entries exceed the " + std::to_string(h.data_bytes) + " data bytes"};
    }
    sum += e.length;
  }
  if (sum != h.data_bytes) {
    return {ErrorCode::kProtocolError, "scatter entries cover " + std::to_string(sum) + " of " +
                                           std::to_string(h.data_bytes) + " data bytes"};
  }
  *refusal = AmRefusal::kNone;
  const uint8_t* src = payload + table;
  for (uint32_t i = 0; i < h.count; ++i) {
    AmScatterEntry e;
    std::memcpy(&e, payload + uint64_t(i) * sizeof(e), sizeof(e));
    if (e.length > 0) std::memcpy(spans.resolve(e.offset, e.length), src, e.length);
    src += e.length;
  }
  return Status::Ok();
}

bool parse_ack(const void* data, size_t length, AmAck* out) {
  if (data == nullptr || length != sizeof(AmAck)) return false;
  std::memcpy(out, data, sizeof(AmAck));
  return out->magic == kAmMagic && out->refusal <= kMaxAmRefusal;
}

}  // namespace kvferry::ucx
