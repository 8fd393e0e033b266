// The simulated forward pass of a `kvferry bench` prefill rank (--prefill-ms-per-layer,
// --layerwise; bench.h): one room at a time (the rank's one accelerator), each of the model's
// layers taking ns_per_layer. A room enters the queue once decode's metadata is there (the rank
// may send it); it starts computing when the previous room's last layer ends (or at once when
// idle), and layer l of it ends at start + (l + 1) x ns_per_layer. The rank sleeps until the next
// layer end (next_event_ns(): a timed wait, never a spin), then sends what the layers finished
// allow: with --layerwise each layer as it ends, otherwise the whole room after its last layer.
//
// Pure bookkeeping over times the caller passes (CLOCK_MONOTONIC ns), so it is tested without a
// clock. Thread contract: one thread.
#pragma once
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <vector>

namespace kvferry::bench {

struct LayerDone {
  uint64_t room = 0;
  uint32_t layer = 0;
  int64_t end_ns = 0;  // when the layer's compute ended (scheduled time)
  bool last = false;   // the room's last layer: its forward pass is over
};

class PrefillCompute {
 public:
  PrefillCompute(uint32_t num_layers, int64_t ns_per_layer)
      : layers_(num_layers == 0 ? 1 : num_layers), ns_(ns_per_layer < 0 ? 0 : ns_per_layer) {}

  // `room` is ready to compute from `now` on (FIFO behind the rooms queued before it).
  void enqueue(uint64_t room, int64_t now) { queue_.push_back({room, now}); }
  // Every layer that ended at or before `now` since the last call, in order (across rooms).
  std::vector<LayerDone> advance(int64_t now);
  // When the next layer ends (max(): nothing queued or computing).
  int64_t next_event_ns() const;
  bool idle() const { return !current_ && queue_.empty(); }
  uint32_t layers() const { return layers_; }

 private:
  struct Queued {
    uint64_t room;
    int64_t ready_ns;
  };
  struct Current {
    uint64_t room;
    int64_t start_ns;
    uint32_t done;  // layers reported so far
  };
  // Starts the next queued room if none is computing (at its ready time or when the device freed).
  void start_next();

  uint32_t layers_;
  int64_t ns_;
  std::deque<Queued> queue_;
  std::optional<Current> current_;
  int64_t free_at_ns_ = std::numeric_limits<int64_t>::min();  // the last room's last layer end
};

}  // namespace kvferry::bench
