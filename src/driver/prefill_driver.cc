#include "driver/prefill_driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "manager/log_policy.h"
#include "manager/manager_internal.h"
#include "driver/metrics_hooks.h"
#include "driver/room_faults.h"
#include "driver/sibling_fanout.h"
#include "kvferry/content.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.driver";
}

PrefillDriver::PrefillDriver(Manager& manager, PrefillDriverConfig config)
    : manager_(manager), core_(internal(manager).core()), ep_(*internal(manager).prefill()), cfg_(config),
      staging_(core_.layout().num_pages), filler_(core_.waker()) {
  internal(manager_).set_chunk_done_hook([this](const ChunkDone& done) { on_chunk_done(done); });
  cfg_.chunk_pages = std::max<uint64_t>(1, std::min<uint64_t>(cfg_.chunk_pages, std::max<uint64_t>(1, staging_.total_pages() / 2)));
}

PrefillDriver::~PrefillDriver() { internal(manager_).set_chunk_done_hook({}); }

void PrefillDriver::apply(const Decision& d) {
  switch (d.op) {
    case Decision::Op::kNew: {
      if (rooms_.count(d.room)) return;
      Room& r = rooms_[d.room];
      r.req = d.request;
      ep_.add_room(d.room, d.request.input_tokens);
      const RankId self = core_.self();
      const RoomFaults faults(d.request.fault, self);
      if (faults.fail_here()) {  // fails here, before any byte is sent
        ep_.fail(d.room, ErrorCode::kInjected, "injected prefill failure (replay fault plan)", self,
                 monotonic_ns(), true);
        return;
      }
      if (faults.fail_transfer() && core_.faults())  // the rank is built with the decorator
        core_.faults()->fail_room(d.room, ErrorCode::kTransferError, "injected transfer error (replay fault plan)");
      if (faults.peers_silent())  // our decode peer stays silent: bootstrap timeout here
        ep_.set_bootstrap_deadline(d.room, monotonic_ns() + core_.config().deadlines.fault_timeout_ms * 1'000'000);
      // A destination must time out waiting for us: stay silent.
      if (const SenderRoom* s = ep_.room(d.room)) r.silent = faults.silent_toward(s->dests);
      return;
    }
    case Decision::Op::kStart: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end() || it->second.started) return;
      it->second.started = true;
      const SenderRoom* s = ep_.room(d.room);
      if (s && s->dests.empty()) {  // our heads go to no decode rank: conclude without writing
        (void)ep_.conclude_without_writing(d.room);
        return;
      }
      start_order_.push_back(d.room);
      return;
    }
    case Decision::Op::kFail: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end()) return;
      auto origin = RankId::parse(d.origin);
      const RankId self = core_.self(), leader{self.role, self.engine_id, 0, self.dp_rank};
      Failure f = failure_of(d);
      f.origin = origin ? *origin : self;
      ep_.fail(d.room, f, d.observed_by_leader && d.origin == self.str(), self.tp_rank != 0 ? &leader : nullptr);
      if (it->second.failed_ns == 0) it->second.failed_ns = monotonic_ns();
      it->second.failure = d;
      it->second.fail_decided = true;
      return;
    }
    case Decision::Op::kRelease: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end()) return;
      log_release(d.room, it->second, d);
      ep_.release(d.room);
      if (core_.faults()) core_.faults()->clear_room(d.room);
      rooms_.erase(it);
      std::erase(start_order_, d.room);
      return;
    }
    case Decision::Op::kAdmit:
    case Decision::Op::kReclaim:
      return;  // decode only
  }
}

void PrefillDriver::log_release(uint64_t room, const Room& r, const Decision& release) {
  const SenderRoom* s = ep_.room(room);
  const uint64_t sent = s ? s->bytes : 0;
  if (!r.fail_decided) {
    log_event(LogLevel::kDebug, kComp, "room released after success", {.room = room});
    metrics_on_release({.sent_bytes = sent});
    return;
  }
  // The engine's root cause as the leader released the room (older leaders: the kFail decision).
  const Failure root = failure_of(release.code != ErrorCode::kOk ? release : r.failure);
  const FailureLine line = failure_release_line(Role::kPrefill, room, root, core_.registry().own(room));
  log_event(line.level, kComp, line.msg, line.fields);
  const bool from_another = line.is_from_another_rank;
  const Decision& f = release.code != ErrorCode::kOk ? release : r.failure;
  metrics_on_release({.failed = true, .code = f.code, .from_another_rank = from_another, .sent_bytes = sent});
}

void PrefillDriver::on_chunk_done(const ChunkDone& done) {
  auto it = send_tags_.find(done.tag);
  if (it == send_tags_.end()) return;
  const uint64_t id = it->second;
  send_tags_.erase(it);
  chunk_send_done(id);
}

void PrefillDriver::chunk_send_done(uint64_t id) {
  auto it = chunks_.find(id);
  if (it == chunks_.end() || --it->second.pending > 0) return;
  staging_.free(it->second.pages);
  auto room = rooms_.find(it->second.room);
  if (room != rooms_.end() && room->second.chunks_out > 0) --room->second.chunks_out;
  chunks_.erase(it);
}

void PrefillDriver::send_chunk(uint64_t id, LayerRange layers, bool last_of_chunk) {
  auto c = chunks_.find(id);
  if (c == chunks_.end()) return;
  const Chunk& ch = c->second;
  const uint64_t tag = next_tag_++;
  Status s = core_.registry().get(ch.room)
                 ? Status(ErrorCode::kAborted, "room failed")
                 : ep_.send(ch.room, ch.first_page, ch.pages, tag, {}, ch.last && last_of_chunk, layers);
  if (!s.ok()) {
    if (s.code() != ErrorCode::kAborted)
      ep_.fail(ch.room, ErrorCode::kInternal, "send() refused: " + s.str(), core_.self(), monotonic_ns(), true);
    chunk_send_done(id);
    return;
  }
  send_tags_[tag] = id;
}

void PrefillDriver::submit_fill(uint64_t id) {
  const Chunk& ch = chunks_.at(id);
  const PoolLayout* layout = &core_.layout();
  uint8_t* base = core_.base();
  const uint64_t room = ch.room, first_page = ch.first_page;
  const std::vector<uint64_t> pages = ch.pages;
  auto on_error = [this, room, id](const std::string& what) {
    ep_.fail(room, ErrorCode::kInternal, "fill worker: " + what, core_.self(), monotonic_ns(), true);
    chunk_send_done(id);
  };
  const uint32_t nb = layout->num_buffers();
  if (cfg_.ms_per_layer <= 0 && !cfg_.layerwise) {  // no compute model: fill the chunk, send it
    filler_.submit([this, layout, base, room, first_page, pages, nb, id]() -> JobWorker::Completion {
      for (size_t i = 0; i < pages.size(); ++i)
        for (uint32_t b = 0; b < nb; ++b)
          fill_page(*layout, room, b, (first_page + i) * layout->page_size, base + layout->page_offset(b, pages[i]));
      return [this, id] { send_chunk(id, {}, true); };
    }, on_error);
    return;
  }
  // The compute model: layer l of the chunk (its K and V buffers: l + t x num_layers) takes at
  // least ms_per_layer on the worker, the rank's one "accelerator" (jobs run one at a time).
  const uint32_t layers = layout->model.num_layers;
  const auto per_layer = std::chrono::nanoseconds(static_cast<int64_t>(cfg_.ms_per_layer * 1e6));
  const bool last_chunk = ch.last;
  for (uint32_t l = 0; l < layers; ++l) {
    filler_.submit([this, layout, base, room, first_page, pages, nb, layers, l, per_layer, id,
                    last_chunk]() -> JobWorker::Completion {
      const auto start = std::chrono::steady_clock::now();
      for (size_t i = 0; i < pages.size(); ++i)
        for (uint32_t b = l; b < nb; b += layers)
          fill_page(*layout, room, b, (first_page + i) * layout->page_size, base + layout->page_offset(b, pages[i]));
      std::this_thread::sleep_until(start + per_layer);
      const int64_t end_ns = monotonic_ns();
      const bool last_layer = l + 1 == layers;
      return [this, room, id, l, last_layer, last_chunk, end_ns] {
        if (last_layer && last_chunk) {
          auto r = rooms_.find(room);
          if (r != rooms_.end()) r->second.compute_end_ns = end_ns;
        }
        if (cfg_.layerwise) send_chunk(id, {l, l + 1}, last_layer);
        else if (last_layer) send_chunk(id, {}, true);
      };
    }, on_error);
  }
}

void PrefillDriver::schedule_chunks() {
  for (uint64_t id : start_order_) {
    auto it = rooms_.find(id);
    if (it == rooms_.end()) continue;
    Room& r = it->second;
    const SenderRoom* s = ep_.room(id);
    if (!s || s->state.terminal() || core_.registry().get(id) || r.silent) continue;
    while (r.chunks_out < 2 && r.next_page < s->total_pages) {
      uint64_t want = std::min(cfg_.chunk_pages, s->total_pages - r.next_page);
      uint64_t n = std::min(want, staging_.free_pages());
      if (n == 0) return;  // staging pool full: later rooms wait too (FIFO)
      std::vector<uint64_t> pages = std::move(*staging_.alloc(n));
      const uint64_t chunk = next_tag_++;  // chunk ids and send tags share one counter
      Chunk& ch = chunks_[chunk];
      ch = {id, r.next_page, std::move(pages)};
      r.next_page += n;
      ch.last = r.next_page == s->total_pages;
      // Layer-wise: one send per layer, each counted down by its completion.
      ch.pending = (cfg_.layerwise ? core_.layout().model.num_layers : 1);
      ++r.chunks_out;
      submit_fill(chunk);
    }
  }
}

void PrefillDriver::pump(int64_t now_ns) {
  filler_.drain();
  schedule_chunks();
  ep_.tick(now_ns);
}

std::vector<RoomReport> PrefillDriver::reports(int64_t now_ns) {
  std::vector<RoomReport> out;
  out.reserve(rooms_.size());
  for (auto& [id, r] : rooms_) {
    RoomReport rep;
    rep.room = id;
    rep.tp_rank = core_.self().tp_rank;
    const SenderRoom* s = ep_.room(id);
    auto e = core_.registry().get(id);
    rep.poll = e ? KVPoll::Failed : ep_.poll(id);
    rep.drained = ep_.drained(id) && r.chunks_out == 0;
    if (e) {
      rep.has_failure = true;
      rep.code = e->code;
      rep.origin = e->origin.str();
      rep.reason = e->failure_reason;
      rep.first_seen_ns = e->first_seen_ns;
      rep.wall_ns = e->wall_ns;
      rep.failed_ns = s && s->failed_ns ? s->failed_ns : (r.failed_ns ? r.failed_ns : now_ns);
    }
    if (s) {
      rep.send_ns = s->first_send_ns;
      rep.compute_end_ns = r.compute_end_ns;
      rep.bytes = s->bytes;
    }
    out.push_back(std::move(rep));
  }
  return out;
}

std::vector<Decision> PrefillDriver::decide(const std::map<uint64_t, std::vector<RoomReport>>& by_room,
                                            std::vector<RouterRequest> new_requests, int64_t /*now_ns*/,
                                            std::vector<RoomResult>* results) {
  std::vector<Decision> out;
  new_and_aborts(new_requests, core_.self(), [this](uint64_t id) -> bool* {
    auto it = rooms_.find(id);
    return it == rooms_.end() ? nullptr : &it->second.fail_decided;
  }, &out);
  for (const auto& [id, reps] : by_room) {
    auto it = rooms_.find(id);
    if (it == rooms_.end()) continue;
    Room& r = it->second;
    RoomReduction red = reduce_room(reps);
    Verdict v = room_verdict(id, reps, red, &r.fail_decided, &out);
    if (v == Verdict::kFailDecided) continue;
    if (v == Verdict::kPending && !red.any_failure && !r.start_decided && red.min_poll >= KVPoll::WaitingForInput) {
      r.start_decided = true;
      out.push_back({Decision::Op::kStart, id});
      continue;
    }
    bool done_ok = v == Verdict::kDoneOk, done_failed = v == Verdict::kDoneFailed;
    if (!done_ok && !done_failed) continue;
    RoomResult& res = release_room(id, Role::kPrefill, done_ok, red, &out, results);
    res.first_send_ns = red.min_send_ns;
    res.compute_end_ns = red.max_compute_end_ns;
    res.bytes_transferred = red.bytes;
  }
  return out;
}

std::vector<SiblingFailure> PrefillDriver::take_failures_to_fan_out() {
  return collect_fan_out(rooms_, ep_, core_);
}

bool PrefillDriver::on_sibling_failure(const SiblingFailure& f) {
  return apply_sibling_failure(rooms_, ep_, core_, f, kComp);
}

RankLeakStats PrefillDriver::leak_stats() const {
  RankLeakStats s;
  s.rank = core_.self().str();
  s.live_rooms = ep_.live_rooms() + rooms_.size();
  s.records = core_.registry().records();
  s.pages_in_use = staging_.in_use() + ep_.aux_in_use();
  s.peers = ep_.peers();
  const IncarnationCounts& inc = core_.incarnation_counts();
  s.stale_messages = {inc.stale_registrations, inc.stale_metadata, inc.stale_statuses, inc.stale_heartbeats};
  s.peer_restarts = inc.peer_restarts;
  for (size_t k = 0; k < kRefusalKinds; ++k)
    s.refusals.push_back({std::string(refusal_name(static_cast<Refusal>(k))), core_.refusals().count(static_cast<Refusal>(k))});
  s.refusals.push_back({"foreign", ep_.foreign_messages()});
  s.transport = core_.transport().stats();
  return s;
}

}  // namespace kvferry
