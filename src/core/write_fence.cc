#include "kvferry/write_fence.h"

#include <algorithm>
#include <string>

namespace kvferry {

const char* fence_verdict_name(FenceVerdict v) {
  switch (v) {
    case FenceVerdict::kAdmitted: return "admitted";
    case FenceVerdict::kRoomClosed: return "room not open";
    case FenceVerdict::kOutsideRoom: return "outside the room's pages";
  }
  return "unknown";
}

WriteFence::Pin& WriteFence::Pin::operator=(Pin&& o) noexcept {
  if (this != &o) {
    release();
    fence_ = o.fence_;
    entry_ = o.entry_;
    room_ = o.room_;
    o.fence_ = nullptr;
    o.entry_ = nullptr;
  }
  return *this;
}

bool WriteFence::Pin::contains(uint64_t offset, uint64_t bytes) const {
  if (entry_ == nullptr) return false;
  const std::vector<FenceRange>& r = entry_->ranges;
  // The last range starting at or before `offset`.
  auto it = std::upper_bound(r.begin(), r.end(), offset,
                             [](uint64_t off, const FenceRange& x) { return off < x.offset; });
  if (it == r.begin()) return false;
  --it;
  const uint64_t in = offset - it->offset;  // offset >= it->offset
  return in < it->bytes && bytes <= it->bytes - in;
}

void WriteFence::Pin::release() {
  if (entry_ != nullptr) fence_->unpin(room_);
  fence_ = nullptr;
  entry_ = nullptr;
}

Status WriteFence::open(uint64_t room, std::vector<FenceRange> ranges) {
  std::erase_if(ranges, [](const FenceRange& r) { return r.bytes == 0; });
  for (const FenceRange& r : ranges) {
    if (r.offset > UINT64_MAX - r.bytes) {
      return {ErrorCode::kInvalidArgument,
              "fence range at " + std::to_string(r.offset) + " overflows"};
    }
  }
  if (ranges.empty()) return {ErrorCode::kInvalidArgument, "fence of a room without bytes"};
  std::sort(ranges.begin(), ranges.end(),
            [](const FenceRange& a, const FenceRange& b) { return a.offset < b.offset; });
  size_t out = 0;
  for (size_t i = 1; i < ranges.size(); ++i) {
    FenceRange& last = ranges[out];
    const uint64_t end = last.offset + last.bytes;  // checked above, and only grows below
    if (ranges[i].offset <= end) {
      last.bytes = std::max(end, ranges[i].offset + ranges[i].bytes) - last.offset;
    } else {
      ranges[++out] = ranges[i];
    }
  }
  ranges.resize(out + 1);
  ranges.shrink_to_fit();
  auto entry = std::make_unique<Entry>();
  entry->ranges = std::move(ranges);
  entry->open = true;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rooms_.find(room);
  if (it != rooms_.end()) {
    return {ErrorCode::kInvalidArgument,
            "room " + std::to_string(room) +
                (it->second->open ? " is open already" : " still has placements running")};
  }
  rooms_.emplace(room, std::move(entry));
  ++open_;
  return Status::Ok();
}

uint64_t WriteFence::close(uint64_t room) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return 0;
  Entry& e = *it->second;
  if (e.open) {
    e.open = false;
    --open_;
  }
  const uint64_t pins = e.pins;
  if (pins == 0) rooms_.erase(it);
  return pins;
}

bool WriteFence::is_open(uint64_t room) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rooms_.find(room);
  return it != rooms_.end() && it->second->open;
}

uint64_t WriteFence::pinned(uint64_t room) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rooms_.find(room);
  return it == rooms_.end() ? 0 : it->second->pins;
}

size_t WriteFence::open_rooms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

std::vector<FenceRange> WriteFence::ranges(uint64_t room) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rooms_.find(room);
  if (it == rooms_.end() || !it->second->open) return {};
  return it->second->ranges;
}

WriteFence::Pin WriteFence::pin(uint64_t room) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rooms_.find(room);
  if (it == rooms_.end() || !it->second->open) return {};
  ++it->second->pins;
  return Pin(this, it->second.get(), room);
}

void WriteFence::unpin(uint64_t room) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return;  // cannot happen: a pinned entry stays
  Entry& e = *it->second;
  if (e.pins > 0) --e.pins;
  if (e.pins == 0 && !e.open) rooms_.erase(it);
}

void WriteFence::count_refusal(FenceVerdict v) {
  if (v == FenceVerdict::kRoomClosed) refused_closed_.fetch_add(1);
  if (v == FenceVerdict::kOutsideRoom) refused_outside_.fetch_add(1);
}

}  // namespace kvferry
