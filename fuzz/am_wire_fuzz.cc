// The active-message write path (src/transport/ucx/am_wire.cc, wire version 2): a write header, a
// scatter message (header + entries + data) and an ack, as a peer sends them, checked against this
// process's own spans and room fence (kvferry/write_fence.h), and the fence's range math itself.
// Input: byte 0 selects the kind; for a write, bytes 1..8 the payload length the header is checked
// against, then the header (fixed size); for a scatter the header then the payload; for kind 3
// (the fence) a room's ranges (16 bytes each: offset, bytes) and, in the last 16 bytes, a write
// to check against them. Whatever the peer says, a placed write stays inside the spans and inside
// the ranges of the open room it names (ASan sees any write outside the span buffers; a linear
// scan recomputes the fence's verdict).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_util.h"
#include "kvferry/write_fence.h"
#include "transport/ucx/am_wire.h"

namespace {

using namespace kvferry::ucx;
using kvferry::FenceRange;
using kvferry::WriteFence;

// Two spans with a hole between them in the offset space, each its own heap block.
struct Spans {
  std::vector<uint8_t> a = std::vector<uint8_t>(4096);
  std::vector<uint8_t> b = std::vector<uint8_t>(8192);
  SpanTable table{{{0, 4096, a.data()}, {16384, 8192, b.data()}}};
};

// Room 1 owns [0, 2048) and [16448, 20544), room 2 [2048, 4096); room 3 was open and is closed.
const std::vector<FenceRange> kRoom1 = {{0, 2048}, {16448, 4096}};
const std::vector<FenceRange> kRoom2 = {{2048, 2048}};

WriteFence& fence() {
  static WriteFence* f = [] {
    auto* w = new WriteFence;
    (void)w->open(1, kRoom1);
    (void)w->open(2, kRoom2);
    (void)w->open(3, {{0, 64}});
    w->close(3);
    return w;
  }();
  return *f;
}

// The fence's verdict by a linear scan over (not coalesced) ranges: inside the union, where a
// write may cross from one range into a touching one.
bool inside_union(const std::vector<FenceRange>& ranges, uint64_t offset, uint64_t bytes) {
  if (offset > UINT64_MAX - bytes) return false;
  const uint64_t end = offset + bytes;
  uint64_t at = offset;
  for (bool grew = true; grew;) {  // extend `at` through every range covering it
    grew = false;
    for (const FenceRange& r : ranges) {
      if (r.bytes == 0 || r.offset > at || at - r.offset >= r.bytes) continue;
      at = r.offset + r.bytes;
      grew = true;
    }
    if (at >= end && at > offset) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Spans spans;
  if (size < 1) return 0;
  const uint8_t kind = data[0] % 4;
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
      WriteFence::Pin pin = fence().pin(h.room);
      FUZZ_CHECK(bool(pin) == (h.room == 1 || h.room == 2));
      if (pin && pin.contains(h.offset, h.length)) {
        FUZZ_CHECK(inside_union(h.room == 1 ? kRoom1 : kRoom2, h.offset, h.length));
        std::memset(dst, 0xab, h.length);  // the receiver places the payload here
      }
    }
  } else if (kind == 1) {  // scatter: header, then entries and data
    if (size < sizeof(AmScatterHeader)) return 0;
    AmScatterHeader h;
    const uint8_t* payload = data + sizeof(AmScatterHeader);
    const size_t payload_length = size - sizeof(AmScatterHeader);
    if (!parse_scatter_header(data, sizeof(AmScatterHeader), payload_length, &h).ok()) return 0;
    WriteFence::Pin pin = fence().pin(h.room);
    AmRefusal refusal;
    if (!pin) return 0;  // the receiver refuses a room that is not open before placing anything
    if (place_scatter(h, payload, payload_length, spans.table, &pin, &refusal).ok()) {
      FUZZ_CHECK(refusal == AmRefusal::kNone);
      for (uint32_t i = 0; i < h.count; ++i) {  // every placed entry lay inside the room
        AmScatterEntry e;
        std::memcpy(&e, payload + uint64_t(i) * sizeof(e), sizeof(e));
        FUZZ_CHECK(inside_union(h.room == 1 ? kRoom1 : kRoom2, e.offset, e.length));
      }
    }
  } else if (kind == 3) {  // the fence's own range math: a room of fuzzed ranges, one write
    if (size < 16) return 0;
    std::vector<FenceRange> ranges((size - 16) / 16);
    if (!ranges.empty()) std::memcpy(ranges.data(), data, ranges.size() * 16);
    uint64_t offset = 0, bytes = 0;
    std::memcpy(&offset, data + size - 16, 8);
    std::memcpy(&bytes, data + size - 8, 8);
    WriteFence f;
    if (!f.open(7, ranges).ok()) return 0;
    bool any = false;
    for (const FenceRange& r : ranges) any |= r.bytes != 0;
    FUZZ_CHECK(any);
    WriteFence::Pin pin = f.pin(7);
    FUZZ_CHECK(bool(pin));
    const bool admitted = pin.contains(offset, bytes);
    // A zero-length write is admitted strictly inside a range only; the scan's union is the same.
    if (bytes > 0) FUZZ_CHECK(admitted == inside_union(ranges, offset, bytes));
    if (admitted) FUZZ_CHECK(offset <= UINT64_MAX - bytes);
    pin.release();
    FUZZ_CHECK(f.close(7) == 0 && !f.is_open(7) && !f.pin(7));
  } else {
    AmAck ack;
    if (parse_ack(data, size, &ack)) FUZZ_CHECK(ack.magic == kAmMagic);
  }
  return 0;
}
