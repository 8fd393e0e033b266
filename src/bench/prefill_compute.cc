#include "bench/prefill_compute.h"

#include <algorithm>

namespace kvferry::bench {

void PrefillCompute::start_next() {
  if (current_ || queue_.empty()) return;
  const Queued q = queue_.front();
  queue_.pop_front();
  current_ = Current{q.room, std::max(q.ready_ns, free_at_ns_), 0};
}

std::vector<LayerDone> PrefillCompute::advance(int64_t now) {
  std::vector<LayerDone> out;
  for (start_next(); current_; start_next()) {
    Current& c = *current_;
    while (c.done < layers_) {
      const int64_t end = c.start_ns + int64_t(c.done + 1) * ns_;
      if (end > now) return out;
      out.push_back({c.room, c.done, end, c.done + 1 == layers_});
      ++c.done;
    }
    free_at_ns_ = c.start_ns + int64_t(layers_) * ns_;
    current_.reset();
  }
  return out;
}

int64_t PrefillCompute::next_event_ns() const {
  if (current_) return current_->start_ns + int64_t(current_->done + 1) * ns_;
  if (queue_.empty()) return std::numeric_limits<int64_t>::max();
  return std::max(queue_.front().ready_ns, free_at_ns_) + ns_;
}

}  // namespace kvferry::bench
