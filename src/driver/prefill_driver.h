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
// Built on a caller-pumped Manager (kvferry/manager.h) and driven only through its public
// Sender, as a serving engine drives it: sender(room) when the request arrives, init() once the
// engine agreed decode is ready (SGLang's order), send() per chunk or layer, poll()/failure() each
// step, the staging ring's pages back through take_completed_sends(), the handle dropped at
// release. Thread contract: main thread only (see EngineLoop).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "driver/engine.h"
#include "driver/job_worker.h"
#include "endpoint/page_allocator.h"
#include "kvferry/manager.h"

namespace kvferry {

struct PrefillDriverConfig {
  uint64_t chunk_pages = 128;  // pages per send() (chunked prefill)
  double ms_per_layer = 0;     // compute model: each layer of each chunk takes this long (0: none)
  bool layerwise = false;      // compute model: send each layer as its compute ends
  // Replay timeout fault at this rank (RoomFaults::peers_silent): the room fails with
  // bootstrap_timeout if decode's metadata has not come this long after the sender's creation
  // (Deadlines::fault_timeout_ms).
  int64_t fault_timeout_ms = 1000;
};

class PrefillDriver : public EngineDriver {
 public:
  PrefillDriver(Manager& manager, PrefillDriverConfig config);
  ~PrefillDriver() override;

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
  std::vector<int> wait_fds() const override { return {filler_.fd()}; }

 private:
  struct Room {
    RouterRequest req;
    std::unique_ptr<Sender> handle;  // null: sender(room) was refused (then local_failure)
    std::optional<KVTransferError> local_failure;
    std::vector<RankId> peers;  // the room's destinations (Sender::peers)
    uint64_t total_pages = 0;
    bool started = false;
    bool silent = false;  // replay timeout fault: never send, so the decode peer times out
    std::optional<FaultSpec> fault;  // the request's fault (placed toward a destination at kStart)
    int64_t fault_deadline_ns = 0;  // replay timeout fault here: bootstrap_timeout at this time
    uint64_t next_page = 0;
    uint32_t chunks_out = 0;     // filling or writing
    uint64_t sends = 0;          // send() calls that returned OK (the next one's number)
    std::map<uint64_t, uint64_t> chunk_of_send;  // a send's number -> its chunk id
    int64_t compute_end_ns = 0;  // compute model: the room's last layer's compute ended
    int64_t failed_ns = 0;
    bool failure_seen = false;   // the fan-out looked at its failure
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
    uint32_t pending = 1;  // sends not yet completed (layer-wise: one per layer)
    bool last = false;     // the room's final chunk
  };
  void schedule_chunks();
  // The fill jobs of chunk `id`: one job (fill, send) without the compute model; else one per
  // layer (fill the layer, sleep out its compute, send it or, after the last, the chunk).
  void submit_fill(uint64_t id);
  // Sends layers `layers` of chunk `id` (its last send: last if the room's final chunk). Each
  // send's completion (Sender::take_completed_sends) counts down the chunk's pending.
  void send_chunk(uint64_t id, LayerRange layers, bool last_of_chunk);
  void chunk_send_done(uint64_t id);
  void take_completions();
  void log_release(uint64_t room, const Room& r, const Decision& release);

  Manager& manager_;
  PrefillDriverConfig cfg_;
  PageAllocator staging_;
  JobWorker filler_;
  std::map<uint64_t, Room> rooms_;
  std::deque<uint64_t> start_order_;
  std::unordered_map<uint64_t, Chunk> chunks_;  // by chunk id
  uint64_t next_chunk_ = 1;
};

}  // namespace kvferry
