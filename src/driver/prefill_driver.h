// PrefillDriver: the scheduler side of a prefill rank (docs/design.md §1 "driver").
//   bootstrap queue: rooms whose senders wait for decode metadata; when every rank has it (the
//                    engine's MIN is WaitingForInput) the leader decides kStart;
//   forward:         started rooms get staging pages chunk by chunk (back-pressure on the staging
//                    pool), a worker thread fills them with the room's deterministic KV content
//                    (the simulated forward pass), then send() writes them;
//   compute model:   with ms_per_layer (replay --prefill-ms-per-layer) the worker fills a chunk
//                    layer by layer, each layer taking at least ms_per_layer (a timed sleep on
//                    the worker thread, one chunk at a time: the rank's one accelerator); with
//                    layerwise each layer is sent as it ends (Sender-style layer ranges,
//                    kvferry/manager.h), otherwise the chunk after its last layer. The end of a
//                    room's last layer goes into its reports (RoomReport::compute_end_ns);
//   inflight queue:  rooms Transferring until every rank is Success, or Failed and drained; the
//                    leader then decides kRelease and reports the room to the router.
// The staging pool is a ring: a chunk's pages return once its writes completed, so a prefill rank
// needs far less memory than a request's KV (decode holds the whole request).
// Built on a caller-pumped Manager (kvferry/manager.h) whose endpoint it drives through
// manager/manager_internal.h: the staging ring needs each chunk's completion, which the public
// Sender does not expose. Thread contract: main thread only (see EngineLoop).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "driver/engine.h"
#include "driver/job_worker.h"
#include "endpoint/page_allocator.h"
#include "endpoint/prefill_endpoint.h"
#include "kvferry/manager.h"

namespace kvferry {

struct PrefillDriverConfig {
  uint64_t chunk_pages = 128;  // pages per send() (chunked prefill)
  double ms_per_layer = 0;     // compute model: each layer of each chunk takes this long (0: none)
  bool layerwise = false;      // compute model: send each layer as its compute ends
};

class PrefillDriver : public EngineDriver {
 public:
  PrefillDriver(Manager& manager, PrefillDriverConfig config);
  ~PrefillDriver() override;

  void on_chunk_done(const ChunkDone& done);

  void apply(const Decision& d) override;
  void pump(int64_t now_ns) override;
  std::vector<RoomReport> reports(int64_t now_ns) override;
  std::vector<Decision> decide(const std::map<uint64_t, std::vector<RoomReport>>& by_room,
                               std::vector<RouterRequest> new_requests, int64_t now_ns,
                               std::vector<RoomResult>* results) override;
  std::vector<SiblingFailure> take_failures_to_fan_out() override;
  bool on_sibling_failure(const SiblingFailure& f) override;
  RankLeakStats leak_stats() const override;
  bool idle() const override { return rooms_.empty(); }

 private:
  struct Room {
    RouterRequest req;
    bool started = false;
    bool silent = false;  // replay timeout fault: never send, so the decode peer times out
    uint64_t next_page = 0;
    uint32_t chunks_out = 0;  // filling or writing
    int64_t compute_end_ns = 0;  // compute model: the room's last layer's compute ended
    int64_t failed_ns = 0;
    bool siblings_know = false;  // the fan-out: told, or learned from a sibling
    // leader only
    bool start_decided = false;
    bool fail_decided = false;
    Decision failure;  // the engine's agreed failure (kFail) once decided
  };
  struct Chunk {
    uint64_t room;
    uint64_t first_page;
    std::vector<uint64_t> pages;
    uint32_t pending = 1;  // sends not yet completed or given up (layer-wise: one per layer)
    bool last = false;     // the room's final chunk
  };
  void schedule_chunks();
  // The fill jobs of chunk `id`: one job (fill, send) without the compute model; else one per
  // layer (fill the layer, sleep out its compute, send it or, after the last, the chunk).
  void submit_fill(uint64_t id);
  // Sends layers `layers` of chunk `id` (its last send: last if the room's final chunk); a room
  // that failed meanwhile sends nothing. Each send's completion (or its skip) counts down pending.
  void send_chunk(uint64_t id, LayerRange layers, bool last_of_chunk);
  void chunk_send_done(uint64_t id);
  void log_release(uint64_t room, const Room& r, const Decision& release);

  Manager& manager_;
  EndpointCore& core_;
  PrefillEndpoint& ep_;
  PrefillDriverConfig cfg_;
  PageAllocator staging_;
  JobWorker filler_;
  std::map<uint64_t, Room> rooms_;
  std::deque<uint64_t> start_order_;
  std::unordered_map<uint64_t, Chunk> chunks_;      // by chunk id
  std::unordered_map<uint64_t, uint64_t> send_tags_;  // a send's tag (ChunkDone) -> its chunk id
  uint64_t next_tag_ = 1;
};

}  // namespace kvferry
