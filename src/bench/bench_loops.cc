#include "bench/bench_loops.h"

#include <algorithm>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

#include "bench/prefill_compute.h"
#include "bench/rank_run.h"
#include "endpoint/page_allocator.h"

namespace kvferry::bench {

int run_prefill(const BenchRankOptions& o, Manager& m, const std::vector<HeadTransfer>& plan,
                const std::string& name) {
  RankRun run(o, m, name);
  const PoolLayout& layout = m.layout();
  const size_t want_peers = dests_of(plan, o.tp_rank).size();
  PageAllocator staging(layout.num_pages);
  // One aux row per open room, as an engine gives each request its own: a room's guard record is
  // staged in its row until written, which a write that reads its source later (a UCX put not
  // copied at once: engine buffers over shm, --memory engine) would otherwise see overwritten.
  PageAllocator aux_rows(layout.aux_slots);
  const uint64_t room_pages = layout.pages_for(o.tokens);
  const uint64_t chunk_pages = std::max<uint64_t>(1, o.chunk_tokens / o.page_size);
  // The compute model (prefill_compute.h): a room's pages stay staged from its forward pass until
  // it ends; without it a chunk's staging pages return when its send's writes ended.
  const bool compute_model = o.prefill_ms_per_layer > 0 || o.layerwise;
  PrefillCompute compute(layout.model.num_layers, static_cast<int64_t>(o.prefill_ms_per_layer * 1e6));
  struct Open {
    std::unique_ptr<Sender> s;
    bool asked = false;             // decode's metadata came (poll left Bootstrapping)
    int64_t first_send = 0;
    uint64_t next_page = 0;
    uint64_t sends = 0;             // the next send()'s number (Sender::take_completed_sends)
    std::unordered_map<uint64_t, std::vector<uint64_t>> out;  // sends not ended -> their staging pages
    bool queued = false;            // compute model: in the forward-pass queue
    std::vector<uint64_t> pages;    // compute model: the room's staged pages
    uint64_t aux = 0;               // its aux row
    int64_t compute_end = 0;        // compute model: its last layer's compute ended
  };
  std::map<uint64_t, Open> open;
  uint64_t next_room = 1, failed = 0;
  // One send(): `staged` are the pages to give back when its writes ended (none with the compute
  // model: the room's pages go back with the room). False: refused, and the room failed here.
  auto send = [&](Open& r, std::span<const uint64_t> pages, std::vector<uint64_t> staged, LayerRange layers,
                  bool last) {
    if (r.first_send == 0) r.first_send = monotonic_ns();
    Status st = r.s->send(pages, layers, {}, last);
    if (!st.ok()) {
      staging.free(staged);
      r.s->fail(ErrorCode::kInternal, "send() refused: " + st.str());
      return false;
    }
    r.out.emplace(r.sends++, std::move(staged));
    return true;
  };
  auto send_staged = [&](Open& r, LayerRange layers, bool last) {
    for (uint64_t first = 0; first < room_pages; first += chunk_pages) {
      const uint64_t n = std::min(chunk_pages, room_pages - first);
      std::span<const uint64_t> chunk(r.pages.data() + first, n);
      if (!send(r, chunk, {}, layers, last && first + n == room_pages)) return;
    }
  };
  auto idle_pump = [&] { run.pump(5); };
  // Every destination's pool registration must be here before rooms start.
  for (int64_t deadline = monotonic_ns() + static_cast<int64_t>(o.timeout_s * 1e9); m.stats().peers < want_peers;) {
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
    // Open rooms: up to `concurrency`; after the window only while decode asked for every open
    // one (decode opens rooms in order, so the next one may be asked for too).
    auto all_asked = [&] {
      return std::all_of(open.begin(), open.end(), [](const auto& kv) { return kv.second.asked; });
    };
    while (now >= go->start && open.size() < o.concurrency && (!after || all_asked())) {
      auto row = aux_rows.alloc(1);
      if (!row) break;  // every row is held by an open room (more open rooms than rows)
      auto s = m.sender(next_room);
      if (!s.ok()) return fail_start("sender(): " + s.status().str());
      Open& r = open[next_room];
      r.s = std::move(*s);
      r.aux = (*row)[0];
      // init() at once, before decode's metadata (the API allows either order; SGLang's is after
      // WaitingForInput): the room's writes then start in the progress step the metadata arrives.
      Status st = r.s->init(room_pages, r.aux, o.tokens);
      if (!st.ok()) return fail_start("init(): " + st.str());
      if (want_peers == 0) {  // our heads go to no decode rank: conclude without writing
        r.first_send = now;
        (void)send(r, {}, {}, {}, true);
      }
      ++next_room;
      if (after) break;  // one at a time: it must be asked for before the next
    }
    // Sends whose writes ended give their staging pages back.
    for (auto& [id, r] : open)
      for (uint64_t n : r.s->take_completed_sends()) {
        auto it = r.out.find(n);
        if (it == r.out.end()) continue;
        staging.free(it->second);
        r.out.erase(it);
      }
    // The forward pass: layers that ended are sent (each one with --layerwise, else the whole
    // room after its last), unless the room failed meanwhile.
    for (const LayerDone& l : compute.advance(now)) {
      auto it = open.find(l.room);
      if (it == open.end()) continue;
      Open& r = it->second;
      if (l.last) r.compute_end = l.end_ns;
      const KVPoll p = r.s->poll();
      if (p != KVPoll::Transferring && p != KVPoll::WaitingForInput) continue;
      if (o.layerwise) send_staged(r, {l.layer, l.layer + 1}, l.last);
      else if (l.last) send_staged(r, {}, true);
    }
    for (auto it = open.begin(); it != open.end();) {
      const uint64_t id = it->first;
      Open& r = it->second;
      KVPoll p = r.s->poll();
      // Asked: decode's metadata came (a room failed while still bootstrapping, e.g. by decode's
      // exit after the window, was not).
      if (p == KVPoll::WaitingForInput || p == KVPoll::Transferring || p == KVPoll::Success) r.asked = true;
      if (want_peers > 0 && (p == KVPoll::WaitingForInput || p == KVPoll::Transferring)) {
        if (compute_model) {
          // Ready to compute once decode's metadata is here and its pages can be staged.
          if (!r.queued && staging.free_pages() >= room_pages) {
            r.pages = std::move(*staging.alloc(room_pages));
            r.queued = true;
            compute.enqueue(id, now);
          }
        }
        while (!compute_model && r.next_page < room_pages) {
          uint64_t n = std::min({chunk_pages, room_pages - r.next_page, staging.free_pages()});
          if (n == 0) break;
          std::vector<uint64_t> pages = std::move(*staging.alloc(n));
          if (o.page_order == "random") shuffle_pages(pages, id * 7919 + r.next_page);
          const std::vector<uint64_t> chunk = pages;
          r.next_page += n;
          if (!send(r, chunk, std::move(pages), {}, r.next_page == room_pages)) break;
        }
        p = r.s->poll();
      }
      if (p == KVPoll::Success) {
        // Every write of the room landed (the guard row goes last): its pages are free.
        run.record({id, r.first_send, monotonic_ns(), r.s->metrics().bytes, r.compute_end});
        for (auto& [n, pages] : r.out) staging.free(pages);
        staging.free(r.pages);
        aux_rows.free({r.aux});
        it = open.erase(it);  // the Sender releases the room
        continue;
      }
      if (p == KVPoll::Failed && r.s->release_safe() && r.out.empty()) {
        // A room no decode rank asked for fails when decode exits after the window: not a failure.
        if (r.asked) ++failed;
        staging.free(r.pages);
        aux_rows.free({r.aux});
        it = open.erase(it);
        continue;
      }
      ++it;
    }
    if (after) {
      // Idle: nothing open beyond rooms no decode rank asked for.
      if (!std::all_of(open.begin(), open.end(), [](const auto& kv) { return !kv.second.asked; })) {
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
  RankRun run(o, m, name);
  const PoolLayout& layout = m.layout();
  PageAllocator pages(layout.num_pages);
  PageAllocator aux(layout.aux_slots);
  const uint64_t room_pages = layout.pages_for(o.tokens);
  struct Open {
    std::unique_ptr<Receiver> r;
    int64_t init_ns = 0;
    std::vector<uint64_t> kv;
    uint64_t aux = 0;
  };
  std::map<uint64_t, Open> open;
  // Rooms released quarantined: their pages come back once take_reclaimed_rooms() names them.
  std::map<uint64_t, std::pair<std::vector<uint64_t>, uint64_t>> quarantine;
  uint64_t next_room = 1, failed = 0;
  auto idle_pump = [&] { run.pump(5); };
  if (!write_file(o.dir + "/ready-" + name, "ready\n")) return fail_start("cannot write the ready file");
  auto go = wait_go(o, idle_pump);
  if (!go) return fail_start("no go from the orchestrator");
  run.go_ = *go;
  const double interval_ns = o.rate > 0 ? 1e9 / o.rate : 0;
  auto give_back = [&](Open& r) {
    pages.free(r.kv);
    aux.free({r.aux});
  };
  for (;;) {
    run.pump(1);
    int64_t now = monotonic_ns();
    run.window_tick(now, run.done_total_);
    for (uint64_t id : m.take_reclaimed_rooms()) {
      auto q = quarantine.find(id);
      if (q == quarantine.end()) continue;
      pages.free(q->second.first);
      aux.free({q->second.second});
      quarantine.erase(q);
    }
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
      auto rc = m.receiver(id);
      if (!rc.ok()) return fail_start("receiver(): " + rc.status().str());
      Open& r = open[id];
      r.r = std::move(*rc);
      r.kv = std::move(*kv);
      if (o.page_order == "random") shuffle_pages(r.kv, id);
      r.aux = (*slot)[0];
      r.init_ns = monotonic_ns();
      Status st = r.r->init();
      if (st.ok()) st = r.r->send_metadata(r.kv, r.aux, {}, o.tokens);
      if (!st.ok()) r.r->fail(ErrorCode::kInternal, "send_metadata() refused: " + st.str());
    }
    for (auto it = open.begin(); it != open.end();) {
      const uint64_t id = it->first;
      Open& r = it->second;
      KVPoll p = r.r->poll();
      if (p == KVPoll::Success) {
        run.record({id, r.init_ns, monotonic_ns(), 0});
        give_back(r);
        it = open.erase(it);  // the Receiver releases the room
        continue;
      }
      if (p == KVPoll::Failed && r.r->release_safe()) {
        ++failed;
        if (r.r->quarantined()) quarantine[id] = {std::move(r.kv), r.aux};
        else give_back(r);
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

}  // namespace kvferry::bench
