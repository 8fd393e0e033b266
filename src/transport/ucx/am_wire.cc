#include "transport/ucx/am_wire.h"

#include <cstring>
#include <string>

namespace kvferry::ucx {

Status parse_write_header(const void* header, size_t header_length, size_t payload_length,
                          uint64_t region_bytes, AmWriteHeader* out) {
  *out = AmWriteHeader{};
  out->magic = 0;
  if (header == nullptr || header_length != sizeof(AmWriteHeader)) {
    return {ErrorCode::kProtocolError,
            "write header of " + std::to_string(header_length) + " bytes, expected " +
                std::to_string(sizeof(AmWriteHeader))};
  }
  std::memcpy(out, header, sizeof(AmWriteHeader));
  if (out->magic != kAmMagic) return {ErrorCode::kProtocolError, "write header: bad magic"};
  if (out->length != payload_length) {
    return {ErrorCode::kProtocolError, "write header length " + std::to_string(out->length) +
                                           " != payload " + std::to_string(payload_length)};
  }
  if (!range_fits(out->offset, out->length, region_bytes)) {
    std::string msg = "write [";  // appended piecewise: GCC 12 warns falsely on "x" + string
    msg += std::to_string(out->offset);
    msg += ", +";
    msg += std::to_string(out->length);
    msg += ") outside the registered region of ";
    msg += std::to_string(region_bytes);
    msg += " bytes";
    return {ErrorCode::kProtocolError, msg};
  }
  return Status::Ok();
}

bool parse_ack(const void* data, size_t length, AmAck* out) {
  if (data == nullptr || length != sizeof(AmAck)) return false;
  std::memcpy(out, data, sizeof(AmAck));
  return out->magic == kAmMagic;
}

}  // namespace kvferry::ucx
