// PageAllocator: page indices of one KV pool, handed out lowest-first in contiguous runs where
// possible (so (src, dst) page pairs coalesce into long writes).
//
// Deterministic: the same sequence of alloc/free calls gives the same pages on every rank, which
// is how the decode ranks of one engine keep identical kv_indices without shipping them around.
// Thread contract: not synchronized; one owner thread.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace kvferry {

class PageAllocator {
 public:
  explicit PageAllocator(uint64_t num_pages);
  // `n` pages (lowest free first), or nullopt if fewer than `n` are free (nothing is taken).
  std::optional<std::vector<uint64_t>> alloc(uint64_t n);
  // Returns pages; a page that is out of range or already free is ignored and counted.
  void free(const std::vector<uint64_t>& pages);
  uint64_t free_pages() const { return free_count_; }
  uint64_t total_pages() const { return total_; }
  uint64_t in_use() const { return total_ - free_count_; }
  uint64_t bad_frees() const { return bad_frees_; }

 private:
  void free_one(uint64_t page);
  std::map<uint64_t, uint64_t> free_;  // start -> length, disjoint, non-adjacent
  uint64_t total_;
  uint64_t free_count_;
  uint64_t bad_frees_ = 0;
};

}  // namespace kvferry
