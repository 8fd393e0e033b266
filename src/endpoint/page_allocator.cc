#include "endpoint/page_allocator.h"

#include <algorithm>
#include <iterator>

namespace kvferry {

PageAllocator::PageAllocator(uint64_t num_pages) : total_(num_pages), free_count_(num_pages) {
  if (num_pages > 0) free_[0] = num_pages;
}

std::optional<std::vector<uint64_t>> PageAllocator::alloc(uint64_t n) {
  if (n > free_count_) return std::nullopt;
  std::vector<uint64_t> out;
  out.reserve(n);
  while (out.size() < n) {
    auto it = free_.begin();
    uint64_t start = it->first, len = it->second;
    uint64_t take = std::min<uint64_t>(len, n - out.size());
    for (uint64_t i = 0; i < take; ++i) out.push_back(start + i);
    free_.erase(it);
    if (take < len) free_[start + take] = len - take;
  }
  free_count_ -= n;
  return out;
}

void PageAllocator::free_one(uint64_t page) {
  if (page >= total_) {
    ++bad_frees_;
    return;
  }
  auto next = free_.upper_bound(page);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > page) {  // already free
      ++bad_frees_;
      return;
    }
  }
  ++free_count_;
  uint64_t start = page, len = 1;
  if (next != free_.end() && next->first == page + 1) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == page) {
      prev->second += len;
      return;
    }
  }
  free_[start] = len;
}

void PageAllocator::free(const std::vector<uint64_t>& pages) {
  for (uint64_t p : pages) free_one(p);
}

}  // namespace kvferry
