// The offset space of a rank (kvferry/transport.h "Memory"): non-overlapping spans, each placed
// at an offset, kept sorted by offset. Used for our own registered spans (where a receiver checks
// every incoming write) and for a peer's announced spans (where a sender checks every op).
//
// Thread contract: a SpanTable is immutable once built; concurrent reads are fine.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kvferry/error.h"
#include "kvferry/transport.h"

namespace kvferry::ucx {

// True when [offset, offset + length) lies inside [0, bytes) (overflow-safe).
constexpr bool range_fits(uint64_t offset, uint64_t length, uint64_t bytes) {
  return offset <= bytes && length <= bytes - offset;
}

// Checks the shape of a span list: 1..max_spans spans, none empty, offset + bytes not
// overflowing, no two overlapping in the offset space. `what` prefixes the message ("span 3 ...").
// Errors: `code` (kInvalidArgument for our own spans, kProtocolError for a peer's).
// On success fills *order with the indices of `spans` sorted by offset.
template <class T>
Status check_spans(const std::vector<T>& spans, size_t max_spans, ErrorCode code,
                   const std::string& what, std::vector<size_t>* order) {
  if (spans.empty()) return {code, what + ": no spans"};
  if (spans.size() > max_spans) {
    return {code, what + ": " + std::to_string(spans.size()) + " spans (at most " +
                      std::to_string(max_spans) + ")"};
  }
  order->resize(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    (*order)[i] = i;
    if (spans[i].bytes == 0) return {code, what + ": span " + std::to_string(i) + " is empty"};
    if (spans[i].offset > UINT64_MAX - spans[i].bytes) {
      return {code, what + ": span " + std::to_string(i) + " at offset " +
                        std::to_string(spans[i].offset) + " + " + std::to_string(spans[i].bytes) +
                        " bytes overflows"};
    }
  }
  std::sort(order->begin(), order->end(),
            [&](size_t a, size_t b) { return spans[a].offset < spans[b].offset; });
  for (size_t k = 1; k < order->size(); ++k) {
    const T& prev = spans[(*order)[k - 1]];
    const T& cur = spans[(*order)[k]];
    if (cur.offset < prev.offset + prev.bytes) {  // no overflow: checked above
      return {code, what + ": span " + std::to_string((*order)[k]) + " overlaps span " +
                        std::to_string((*order)[k - 1]) + " in the offset space"};
    }
  }
  return Status::Ok();
}

// The span of `sorted` (by offset; each with .offset and .bytes) that holds all of
// [offset, offset + length), overflow-safe; nullptr when none does (outside every span, or
// crossing a span's edge). A zero-length range needs offset inside a span or at its end.
template <class T>
const T* find_span(const std::vector<T>& sorted, uint64_t offset, uint64_t length) {
  auto it = std::upper_bound(sorted.begin(), sorted.end(), offset,
                             [](uint64_t off, const T& s) { return off < s.offset; });
  if (it == sorted.begin()) return nullptr;
  const T& s = *(it - 1);
  return range_fits(offset - s.offset, length, s.bytes) ? &s : nullptr;
}

// One local span: its memory and its place in the offset space.
struct LocalSpanView {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint8_t* base = nullptr;
};

// Our own registered spans, sorted by offset.
class SpanTable {
 public:
  SpanTable() = default;
  // `spans` must have passed check_spans (any order).
  explicit SpanTable(std::vector<LocalSpanView> spans) : spans_(std::move(spans)) {
    std::sort(spans_.begin(), spans_.end(),
              [](const LocalSpanView& a, const LocalSpanView& b) { return a.offset < b.offset; });
  }
  // Address of [offset, offset + length) when it lies inside one span, else nullptr.
  uint8_t* resolve(uint64_t offset, uint64_t length) const {
    const LocalSpanView* s = find_span(spans_, offset, length);
    return s == nullptr ? nullptr : s->base + (offset - s->offset);
  }
  bool empty() const { return spans_.empty(); }
  size_t size() const { return spans_.size(); }
  const std::vector<LocalSpanView>& spans() const { return spans_; }
  // "1 span of 4096 bytes" / "3 spans" (for error messages).
  std::string describe() const;

 private:
  std::vector<LocalSpanView> spans_;
};

// Checks a peer's RemoteRegionInfo before any of it reaches UCX (limits in kvferry/transport.h):
// worker address length, span count and shape, and (need_rkeys: put mode) every packed rkey's
// length. Errors: kProtocolError naming what is wrong. On success fills *order (spans by offset).
Status check_remote_info(const RemoteRegionInfo& info, bool need_rkeys, std::vector<size_t>* order);

}  // namespace kvferry::ucx
