// The active-message write path (src/transport/ucx/am_wire.cc): a write header, a scatter message
// (header + entries + data) and an ack, as a peer sends them, checked against this process's own
// spans. Input: byte 0 selects the message kind; bytes 1..8 the payload length a write header is
// checked against; the rest is the header (fixed size) then the payload. Whatever the peer says,
// a placed write stays inside the spans (ASan sees any write outside the span buffers).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_util.h"
#include "transport/ucx/am_wire.h"

namespace {

using namespace kvferry::ucx;

// Two spans with a hole between them in the offset space, each its own heap block.
struct Spans {
  std::vector<uint8_t> a = std::vector<uint8_t>(4096);
  std::vector<uint8_t> b = std::vector<uint8_t>(8192);
  SpanTable table{{{0, 4096, a.data()}, {16384, 8192, b.data()}}};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Spans spans;
  if (size < 1) return 0;
  const uint8_t kind = data[0] % 3;
  ++data;
  --size;
  if (kind == 0) {  // write: claimed payload length, header
    if (size < 8) return 0;
    uint64_t payload_length = 0;
    std::memcpy(&payload_length, data, 8);
    data += 8;
    size -= 8;
    AmWriteHeader h;
    uint8_t* dst = nullptr;
    auto st = parse_write_header(data, size, payload_length, spans.table, &h, &dst);
    FUZZ_CHECK(st.ok() == (dst != nullptr));
    if (st.ok()) {
      FUZZ_CHECK(h.length == payload_length);
      FUZZ_CHECK(spans.table.resolve(h.offset, h.length) == dst);
      std::memset(dst, 0xab, h.length);  // the receiver places the payload here
    }
  } else if (kind == 1) {  // scatter: header, then entries and data
    if (size < sizeof(AmScatterHeader)) return 0;
    AmScatterHeader h;
    const uint8_t* payload = data + sizeof(AmScatterHeader);
    const size_t payload_length = size - sizeof(AmScatterHeader);
    if (!parse_scatter_header(data, sizeof(AmScatterHeader), payload_length, &h).ok()) return 0;
    (void)place_scatter(h, payload, payload_length, spans.table);
  } else {
    AmAck ack;
    if (parse_ack(data, size, &ack)) FUZZ_CHECK(ack.magic == kAmMagic);
  }
  return 0;
}
