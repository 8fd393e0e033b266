// One `kvferry bench-rank` process (bench.h describes the protocol). The rank is a caller-pumped
// Manager (kvferry/manager.h); the loops drive its endpoint through manager/manager_internal.h
// (the staging ring frees a chunk's pages when its writes completed, which the public Sender does
// not expose).
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/bench.h"
#include "bench/prefill_compute.h"
#include "bench/proc_stats.h"
#include "endpoint/page_allocator.h"
#include "endpoint/topology.h"
#include "kvferry/log.h"
#include "kvferry/manager.h"
#include "manager/manager_internal.h"

namespace kvferry::bench {
namespace {
constexpr std::string_view kComp = "bench";
constexpr int64_t kPrefillLingerNs = 300'000'000;  // idle after the window: late metadata still served
constexpr int64_t kDrainCapNs = 20'000'000'000;    // after the window, open rooms get this long

int fail_start(const std::string& what) {
  log_event(LogLevel::kCritical, kComp, "cannot start: " + what);
  flush_logging();
  return 2;
}

// --page-order random: a fixed permutation per (room, chunk), so runs are repeatable.
void shuffle_pages(std::vector<uint64_t>& pages, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::shuffle(pages.begin(), pages.end(), rng);
}

bool write_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) return false;
    f << text;
    if (!f) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

struct Go {
  int64_t start = 0, window_start = 0, window_end = 0;
};

std::optional<Go> read_go(const std::string& dir) {
  std::ifstream f(dir + "/go");
  Go g;
  if (!(f >> g.start >> g.window_start >> g.window_end)) return std::nullopt;
  return g;
}

// One room as this rank saw it.
struct Sample {
  uint64_t room = 0;
  int64_t start_ns = 0;  // prefill: first send(); decode: init()
  int64_t end_ns = 0;    // Success
  uint64_t bytes = 0;    // prefill: bytes written
  int64_t compute_end_ns = 0;  // prefill with the compute model: its last layer's compute ended
};

// What both roles share: the loop plumbing and the measurements.
class RankRun {
 public:
  // Samples of the rooms go to a scratch file as they come (a fixed stdio buffer), not
  // to memory: the rank's resident memory must not grow with the rooms it served.
  RankRun(const BenchRankOptions& o, Manager& manager, const std::string& name)
      : o_(o), manager_(manager), samples_path_(o.dir + "/" + name + ".samples") {
    samples_ = std::fopen(samples_path_.c_str(), "w+b");
  }
  ~RankRun() {
    if (samples_) {
      std::fclose(samples_);
      std::remove(samples_path_.c_str());
    }
  }
  RankRun(const RankRun&) = delete;
  RankRun& operator=(const RankRun&) = delete;

  // Waits up to `timeout_ms` for the manager's fds, then one round of its progress (control
  // frames, transport completions to the chunk hook, deadlines).
  void pump(int timeout_ms) {
    std::vector<int> fds = manager_.wait_fds();
    wait_readable(fds.data(), static_cast<int>(fds.size()), timeout_ms);
    manager_.progress();
  }
  // The same, waiting at most until `deadline_ns` (ns precision: the compute model's layer ends)
  // and never longer than 1 ms.
  void pump_until(int64_t deadline_ns) {
    const int64_t wait = std::clamp<int64_t>(deadline_ns - monotonic_ns(), 0, 1'000'000);
    std::vector<pollfd> p;
    for (int fd : manager_.wait_fds())
      if (fd >= 0) p.push_back({fd, POLLIN, 0});
    const timespec ts{0, static_cast<long>(wait)};
    ::ppoll(p.data(), p.size(), &ts, nullptr);
    manager_.progress();
  }

  void window_tick(int64_t now, uint64_t done_total) {
    if (!window_started_ && now >= go_.window_start) {
      window_started_ = true;
      cpu_start_ = cpu_seconds();
      rss_start_ = read_rss();
      faults_start_ = read_faults();
      writes_start_ = manager_.stats().transport.writes;
      rooms_at_start_ = done_total;
    }
    if (window_started_ && !window_ended_ && now >= go_.window_end) {
      window_ended_ = true;
      cpu_end_ = cpu_seconds();
      rss_end_ = read_rss();
      faults_end_ = read_faults();
      writes_end_ = manager_.stats().transport.writes;
    }
    if (o_.rss_checkpoint && !checkpoint_taken_ && done_total >= o_.rss_checkpoint) {
      checkpoint_taken_ = true;
      rss_checkpoint_ = read_rss();
    }
  }

  // Every finished room, warm-up and drain included: a room in flight at an edge of the window
  // counts in part (summary.h), and which rooms completed inside the window is decided over all
  // ranks of a side by the summary.
  void record(const Sample& s) {
    ++done_total_;
    if (samples_ && std::fwrite(&s, sizeof s, 1, samples_) != 1) samples_failed_ = true;
  }

  int finish(const std::string& name, uint64_t failed, uint64_t open_at_exit) {
    if (!window_ended_) {  // should not happen; measure now so the file is complete
      cpu_end_ = cpu_seconds();
      rss_end_ = read_rss();
      faults_end_ = read_faults();
      writes_end_ = manager_.stats().transport.writes;
    }
    nlohmann::json j;
    j["name"] = name;
    j["role"] = o_.prefill ? "prefill" : "decode";
    j["tp_rank"] = o_.tp_rank;
    j["cpu_s"] = cpu_end_ - cpu_start_;
    j["rooms_total"] = done_total_;
    j["rooms_before_window"] = rooms_at_start_;
    j["failed"] = failed;
    j["open_at_exit"] = open_at_exit;
    j["rss_start"] = rss_start_.to_json();
    j["rss_end"] = rss_end_.to_json();
    if (checkpoint_taken_) j["rss_checkpoint"] = rss_checkpoint_.to_json();
    j["pool_bytes"] = manager_.layout().total_bytes();
    // Page faults inside the window (docs/BENCHMARKS.md "Page faults") and whether the pool is
    // locked (docs/transport.md "Resident memory").
    j["minor_faults"] = faults_end_.minor - faults_start_.minor;
    j["major_faults"] = faults_end_.major - faults_start_.major;
    const TransportStats ts = manager_.stats().transport;
    j["locked_bytes"] = ts.locked_bytes;
    j["unlocked_bytes"] = ts.unlocked_bytes;
    j["residency_warnings"] = ts.residency_warnings;
    j["tcp_sockets_tuned"] = ts.tcp_sockets_tuned;
    j["tcp_congestion_failures"] = ts.tcp_congestion_failures;
    j["writes"] = writes_end_ - writes_start_;  // transport operations (puts / messages) in the window
    if (!samples_ || samples_failed_ || std::fflush(samples_) != 0)
      return fail_start("cannot write the room samples to " + samples_path_);
    nlohmann::json rooms = nlohmann::json::array();
    std::rewind(samples_);
    for (Sample s; std::fread(&s, sizeof s, 1, samples_) == 1;)
      rooms.push_back({s.room, s.start_ns, s.end_ns, s.bytes, s.compute_end_ns});
    j["rooms"] = std::move(rooms);
    if (!write_file(o_.dir + "/" + name + ".json", j.dump())) return fail_start("cannot write result file");
    flush_logging();
    return 0;
  }

  Go go_;
  uint64_t done_total_ = 0;

 private:
  const BenchRankOptions& o_;
  Manager& manager_;
  bool window_started_ = false, window_ended_ = false, checkpoint_taken_ = false;
  double cpu_start_ = 0, cpu_end_ = 0;
  RssSample rss_start_, rss_end_, rss_checkpoint_;
  FaultSample faults_start_, faults_end_;
  uint64_t writes_start_ = 0, writes_end_ = 0;
  uint64_t rooms_at_start_ = 0;
  std::string samples_path_;
  std::FILE* samples_ = nullptr;
  bool samples_failed_ = false;
};

// Waits for DIR/go, pumping the endpoint (heartbeats, registrations) meanwhile.
template <class Pump>
std::optional<Go> wait_go(const BenchRankOptions& o, Pump&& pump) {
  int64_t deadline = monotonic_ns() + static_cast<int64_t>(o.timeout_s * 1e9);
  while (monotonic_ns() < deadline) {
    if (auto g = read_go(o.dir)) return g;
    pump();
  }
  return std::nullopt;
}

int run_prefill(const BenchRankOptions& o, Manager& m, const std::vector<HeadTransfer>& plan,
                const std::string& name) {
  EndpointCore& c = internal(m).core();
  PrefillEndpoint& ep = *internal(m).prefill();
  RankRun run(o, m, name);
  const size_t want_peers = dests_of(plan, o.tp_rank).size();
  PageAllocator staging(c.layout().num_pages);
  const uint64_t room_pages = c.layout().pages_for(o.tokens);
  const uint64_t chunk_pages = std::max<uint64_t>(1, o.chunk_tokens / o.page_size);
  // The compute model (prefill_compute.h): a room's pages stay staged from its forward pass until
  // it ends; without it a chunk's staging pages return when its writes completed.
  const bool compute_model = o.prefill_ms_per_layer > 0 || o.layerwise;
  PrefillCompute compute(c.layout().model.num_layers, static_cast<int64_t>(o.prefill_ms_per_layer * 1e6));
  struct Open {
    int64_t first_send = 0;
    uint64_t next_page = 0;
    uint32_t chunks_out = 0;
    bool queued = false;            // compute model: in the forward-pass queue
    std::vector<uint64_t> pages;    // compute model: the room's staged pages
    int64_t compute_end = 0;        // compute model: its last layer's compute ended
  };
  std::map<uint64_t, Open> open;
  std::unordered_map<uint64_t, std::vector<uint64_t>> chunk_pages_of;  // tag -> staging pages
  uint64_t next_tag = 1, next_room = 1, max_meta_room = 0, failed = 0;
  internal(m).set_message_hook([&](const Message& msg) {
    if (auto* md = std::get_if<RoomMetadata>(&msg)) max_meta_room = std::max(max_meta_room, md->room);
  });
  internal(m).set_chunk_done_hook([&](const ChunkDone& d) {
    const ChunkDone* done = &d;
    auto it = chunk_pages_of.find(done->tag);
    if (it == chunk_pages_of.end()) return;
    staging.free(it->second);
    chunk_pages_of.erase(it);
    auto r = open.find(done->room);
    if (r != open.end() && r->second.chunks_out > 0) --r->second.chunks_out;
  });
  // Compute model: the room's pages [0, room_pages) of layers `layers` from its staged pages, in
  // chunks; `last` on the final chunk. False: the room failed here (send refused).
  auto send_staged = [&](uint64_t id, Open& r, LayerRange layers, bool last) {
    for (uint64_t first = 0; first < room_pages; first += chunk_pages) {
      const uint64_t n = std::min(chunk_pages, room_pages - first);
      std::vector<uint64_t> chunk(r.pages.begin() + static_cast<std::ptrdiff_t>(first),
                                  r.pages.begin() + static_cast<std::ptrdiff_t>(first + n));
      const uint64_t tag = next_tag++;
      if (r.first_send == 0) r.first_send = monotonic_ns();
      Status st = ep.send(id, first, chunk, tag, {}, last && first + n == room_pages, layers);
      if (!st.ok()) {
        ep.fail(id, ErrorCode::kInternal, "send() refused: " + st.str(), c.self(), monotonic_ns(), true);
        return false;
      }
      chunk_pages_of[tag] = {};  // the pages go back with the room
      ++r.chunks_out;
    }
    return true;
  };
  auto idle_pump = [&] { run.pump(5); };
  // Every destination's pool registration must be here before rooms start.
  for (int64_t deadline = monotonic_ns() + static_cast<int64_t>(o.timeout_s * 1e9); ep.peers() < want_peers;) {
    if (monotonic_ns() > deadline) return fail_start("the decode ranks' pool registrations never arrived");
    idle_pump();
  }
  if (!write_file(o.dir + "/ready-" + name, "ready\n")) return fail_start("cannot write the ready file");
  auto go = wait_go(o, idle_pump);
  if (!go) return fail_start("no go from the orchestrator");
  run.go_ = *go;
  int64_t idle_since = 0;
  for (;;) {
    if (compute_model) run.pump_until(compute.next_event_ns());
    else run.pump(1);
    int64_t now = monotonic_ns();
    run.window_tick(now, run.done_total_);
    const bool after = now >= go->window_end;
    // Open rooms: up to `concurrency`; after the window only those decode already asked for.
    while (now >= go->start && open.size() < o.concurrency && (!after || next_room <= max_meta_room)) {
      ep.add_room(next_room, o.tokens);
      open[next_room] = {};
      ++next_room;
    }
    // The forward pass: layers that ended are sent (each one with --layerwise, else the whole
    // room after its last), unless the room failed or was released meanwhile.
    for (const LayerDone& l : compute.advance(now)) {
      auto it = open.find(l.room);
      if (it == open.end()) continue;
      Open& r = it->second;
      if (l.last) r.compute_end = l.end_ns;
      if (ep.poll(l.room) != KVPoll::Transferring && ep.poll(l.room) != KVPoll::WaitingForInput) continue;
      if (o.layerwise) (void)send_staged(l.room, r, {l.layer, l.layer + 1}, l.last);
      else if (l.last) (void)send_staged(l.room, r, {}, true);
    }
    for (auto it = open.begin(); it != open.end();) {
      const uint64_t id = it->first;
      Open& r = it->second;
      KVPoll p = ep.poll(id);
      if (p == KVPoll::WaitingForInput || p == KVPoll::Transferring) {
        const SenderRoom* s = ep.room(id);
        if (p == KVPoll::WaitingForInput && s && s->dests.empty() && r.next_page == 0) {
          r.first_send = now;
          (void)ep.conclude_without_writing(id);
        }
        if (compute_model) {
          // Ready to compute once decode's metadata is here and its pages can be staged.
          if (s && !s->dests.empty() && !r.queued && staging.free_pages() >= room_pages) {
            r.pages = std::move(*staging.alloc(room_pages));
            r.queued = true;
            compute.enqueue(id, now);
          }
        }
        while (!compute_model && s && !s->dests.empty() && r.next_page < room_pages) {
          uint64_t n = std::min({chunk_pages, room_pages - r.next_page, staging.free_pages()});
          if (n == 0) break;
          std::vector<uint64_t> pages = std::move(*staging.alloc(n));
          if (o.page_order == "random") shuffle_pages(pages, id * 7919 + r.next_page);
          uint64_t tag = next_tag++;
          if (r.first_send == 0) r.first_send = monotonic_ns();
          Status st = ep.send(id, r.next_page, pages, tag);
          if (!st.ok()) {
            staging.free(pages);
            ep.fail(id, ErrorCode::kInternal, "send() refused: " + st.str(), c.self(), monotonic_ns(), true);
            break;
          }
          chunk_pages_of[tag] = std::move(pages);
          r.next_page += n;
          ++r.chunks_out;
        }
        p = ep.poll(id);
      }
      if (p == KVPoll::Success) {
        const SenderRoom* s = ep.room(id);
        run.record({id, r.first_send, monotonic_ns(), s ? s->bytes : 0, r.compute_end});
        ep.release(id);
        staging.free(r.pages);
        it = open.erase(it);
        continue;
      }
      if (p == KVPoll::Failed && ep.drained(id) && r.chunks_out == 0) {
        // A room no decode rank asked for fails when decode exits after the window: not a failure.
        if (id <= max_meta_room) ++failed;
        ep.release(id);
        staging.free(r.pages);
        it = open.erase(it);
        continue;
      }
      ++it;
    }
    if (after) {
      bool idle = true;  // nothing open beyond rooms no decode rank asked for
      for (const auto& [id, r] : open)
        if (id <= max_meta_room || ep.poll(id) != KVPoll::Bootstrapping) idle = false;
      if (!idle) {
        idle_since = 0;
      } else if (idle_since == 0) {
        idle_since = now;
      } else if (now - idle_since > kPrefillLingerNs) {
        run.window_tick(now, run.done_total_);
        return run.finish(name, failed, 0);
      }
      if (now - go->window_end > kDrainCapNs) return run.finish(name, failed, open.size());
    }
  }
}

int run_decode(const BenchRankOptions& o, Manager& m, const std::string& name) {
  EndpointCore& c = internal(m).core();
  DecodeEndpoint& ep = *internal(m).decode();
  RankRun run(o, m, name);
  PageAllocator pages(c.layout().num_pages);
  PageAllocator aux(c.layout().aux_slots);
  const uint64_t room_pages = c.layout().pages_for(o.tokens);
  struct Open {
    int64_t init_ns = 0;
    std::vector<uint64_t> kv;
    uint64_t aux = 0;
  };
  std::map<uint64_t, Open> open;
  uint64_t next_room = 1, failed = 0;
  auto idle_pump = [&] { run.pump(5); };
  if (!write_file(o.dir + "/ready-" + name, "ready\n")) return fail_start("cannot write the ready file");
  auto go = wait_go(o, idle_pump);
  if (!go) return fail_start("no go from the orchestrator");
  run.go_ = *go;
  const double interval_ns = o.rate > 0 ? 1e9 / o.rate : 0;
  for (;;) {
    int64_t now = monotonic_ns();
    // Sleep no longer than until the next room is due.
    run.pump(1);
    now = monotonic_ns();
    run.window_tick(now, run.done_total_);
    while (now >= go->start && now < go->window_end && open.size() < o.concurrency &&
           now >= go->start + static_cast<int64_t>(interval_ns * static_cast<double>(next_room - 1))) {
      auto kv = pages.alloc(room_pages);
      auto slot = aux.alloc(1);
      if (!kv || !slot) {
        if (kv) pages.free(*kv);
        if (slot) aux.free(*slot);
        break;  // pool full (quarantined pages of failed rooms): wait
      }
      const uint64_t id = next_room++;
      ep.add_room(id, o.tokens);
      Open& r = open[id];
      r.kv = std::move(*kv);
      if (o.page_order == "random") shuffle_pages(r.kv, id);
      r.aux = (*slot)[0];
      r.init_ns = monotonic_ns();
      Status st = ep.init(id, r.kv, static_cast<uint32_t>(r.aux));
      if (!st.ok()) ep.fail(id, ErrorCode::kInternal, "init() refused: " + st.str(), c.self(), monotonic_ns(), true);
    }
    for (auto it = open.begin(); it != open.end();) {
      const uint64_t id = it->first;
      Open& r = it->second;
      KVPoll p = ep.poll(id);
      if (p == KVPoll::Success) {
        run.record({id, r.init_ns, monotonic_ns(), 0});
        pages.free(r.kv);
        aux.free({r.aux});
        ep.release(id);
        it = open.erase(it);
        continue;
      }
      if (p == KVPoll::Failed && ep.drained(id, now)) {
        ++failed;
        pages.free(r.kv);
        aux.free({r.aux});
        ep.release(id);
        it = open.erase(it);
        continue;
      }
      ++it;
    }
    if (now >= go->window_end) {
      run.window_tick(now, run.done_total_);
      if (open.empty()) return run.finish(name, failed, 0);
      if (now - go->window_end > kDrainCapNs) return run.finish(name, failed, open.size());
    }
  }
}

}  // namespace

int run_bench_rank(const BenchRankOptions& o) {
  const std::string name = rank_name(o.prefill, o.tp_rank);
  RankId self{o.prefill ? Role::kPrefill : Role::kDecode, 0, o.tp_rank, 0};
  // Warnings and above only: a debug line per room would be part of what is measured.
  init_logging({self.str(), o.dir + "/" + name + ".log.jsonl", LogLevel::kWarning, LogLevel::kWarning});

  auto model = load_model_file(o.models_file, o.model);
  if (!model.ok()) return fail_start(model.status().str());
  ModelGeometry m = *model;
  if (o.layers) m.num_layers = std::min(m.num_layers, o.layers);
  const uint32_t prefill_tp = o.prefill ? o.tp_size : o.peer_tp_size;
  const uint32_t decode_tp = o.prefill ? o.peer_tp_size : o.tp_size;
  auto plan = plan_transfers(m, prefill_tp, decode_tp);
  if (!plan.ok()) return fail_start(plan.status().str());
  // Pool: `concurrency` rooms of pages (decode: destination pages; prefill: staging), aux slots.
  const uint32_t aux_slots = std::max<uint32_t>(64, 2 * o.concurrency);
  auto probe = make_layout(m, o.tp_size, o.tp_rank, o.page_size, 1ull << 50, aux_slots);
  if (!probe.ok()) return fail_start(probe.status().str());
  const uint64_t pages = probe->pages_for(o.tokens) * o.concurrency;
  const uint64_t pool_bytes = pages * probe->page_bytes() * probe->num_buffers() + aux_slots * kAuxSlotBytes;

  ManagerConfig mc;
  mc.self = self;
  mc.tp_size = o.tp_size;
  mc.peer_tp_size = o.peer_tp_size;
  mc.model = m;
  mc.page_size = o.page_size;
  mc.pool_bytes = pool_bytes;
  mc.aux_rows = aux_slots;
  mc.bootstrap_address = o.bootstrap;
  mc.transport = o.transport;
  mc.transfer_shards = o.transfer_shards;
  mc.tcp_congestion = o.tcp_congestion == "default" ? "" : o.tcp_congestion;
  mc.deadlines.lookup_timeout_ms = static_cast<int64_t>(o.timeout_s * 1000);
  mc.progress_thread = false;
  auto manager = Manager::create(mc);
  if (!manager.ok()) return fail_start(manager.status().str());
  // Touch the whole pool once: KV pages are resident in serving; page faults are not transfer cost.
  std::memset((*manager)->pool_base(), 0, (*manager)->layout().total_bytes());
  if (o.prefill) return run_prefill(o, **manager, *plan, name);
  return run_decode(o, **manager, name);
}

}  // namespace kvferry::bench
