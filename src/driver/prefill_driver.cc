#include "driver/prefill_driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "driver/metrics_hooks.h"
#include "driver/room_faults.h"
#include "driver/sibling_fanout.h"
#include "kvferry/content.h"
#include "kvferry/fault_transport.h"
#include "kvferry/log.h"
#include "manager/log_policy.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.driver";
}

PrefillDriver::PrefillDriver(Manager& manager, PrefillDriverConfig config)
    : manager_(manager), cfg_(config), staging_(manager.layout().num_pages) {
  cfg_.chunk_pages = std::max<uint64_t>(1, std::min<uint64_t>(cfg_.chunk_pages, std::max<uint64_t>(1, staging_.total_pages() / 2)));
}

PrefillDriver::~PrefillDriver() = default;

void PrefillDriver::apply(const Decision& d) {
  const RankId self = manager_.self();
  switch (d.op) {
    case Decision::Op::kNew: {
      if (rooms_.count(d.room)) return;
      Room& r = rooms_[d.room];
      r.req = d.request;
      r.total_pages = manager_.layout().pages_for(d.request.input_tokens);
      auto sender = manager_.sender(d.room);
      if (!sender.ok()) {
        r.local_failure = KVTransferError{d.room, ErrorCode::kInternal, "sender() refused: " + sender.status().str(), self,
                                          false, monotonic_ns()};
        return;
      }
      r.handle = std::move(*sender);
      r.peers = r.handle->peers();  // engine 0's ranks until the room's decode instance is known
      const RoomFaults faults(d.request.fault, self);
      if (faults.fail_here()) {  // fails here, before any byte is sent
        r.handle->fail(ErrorCode::kInjected, "injected prefill failure (replay fault plan)");
        return;
      }
      if (faults.fail_transfer() && manager_.faults())  // the rank is built with the decorator
        manager_.faults()->fail_room(d.room, ErrorCode::kTransferError, "injected transfer error (replay fault plan)");
      if (faults.peers_silent())  // our decode peer stays silent: bootstrap timeout here
        r.fault_deadline_ns = monotonic_ns() + cfg_.fault_timeout_ms * 1'000'000;
      // Faults toward a destination (corrupt, stay silent) are placed at kStart: only once the
      // room's metadata came is its decode instance (xPyD), so its ranks' engine_id, known.
      r.fault = d.request.fault;
      return;
    }
    case Decision::Op::kStart: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end() || it->second.started) return;
      Room& r = it->second;
      r.started = true;
      if (!r.handle) return;
      {
        r.peers = r.handle->peers();  // the room's decode instance's ranks now
        const RoomFaults faults(r.fault, manager_.self());
        for (size_t i = 0; i < r.peers.size(); ++i)  // a room's chunks go to its peers in this order
          if (faults.corrupt_toward(r.peers[i]) && manager_.faults()) manager_.faults()->corrupt_next_write(d.room, i);
        // A destination must time out waiting for us: stay silent.
        r.silent = faults.silent_toward(r.peers);
      }
      // SGLang's order: init() once the engine agreed every rank is WaitingForInput. A room whose
      // heads go to no decode rank still sends its chunks: it concludes on the last, writing nothing.
      Status s = r.handle->init(r.total_pages, 0, r.req.input_tokens);
      if (!s.ok()) {
        if (!r.handle->failure()) r.handle->fail(ErrorCode::kInternal, "init() refused: " + s.str());
        return;
      }
      start_order_.push_back(d.room);
      return;
    }
    case Decision::Op::kFail: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end()) return;
      apply_engine_failure(it->second, d, self);
      return;
    }
    case Decision::Op::kRelease: {
      auto it = rooms_.find(d.room);
      if (it == rooms_.end()) return;
      log_release(d.room, it->second, d);
      for (auto c = chunks_.begin(); c != chunks_.end();) {  // none: released rooms are drained
        if (c->second.room != d.room) {
          ++c;
          continue;
        }
        staging_.free(c->second.pages);
        c = chunks_.erase(c);
      }
      rooms_.erase(it);  // drops the sender: the manager releases the room
      if (manager_.faults()) manager_.faults()->clear_room(d.room);
      std::erase(start_order_, d.room);
      return;
    }
    case Decision::Op::kAdmit:
    case Decision::Op::kReclaim:
      return;  // decode only
  }
}

void PrefillDriver::log_release(uint64_t room, const Room& r, const Decision& release) {
  const uint64_t sent = r.handle ? r.handle->metrics().bytes : 0;
  if (!r.fail_decided) {
    log_event(LogLevel::kDebug, kComp, "room released after success", {.room = room});
    metrics_on_release({.sent_bytes = sent});
    return;
  }
  // The engine's root cause as the leader released the room (older leaders: the kFail decision).
  const Failure root = failure_of(release.code != ErrorCode::kOk ? release : r.failure);
  const FailureLine line =
      failure_release_line(Role::kPrefill, room, root, own_failure(room_failure(r), manager_.self()));
  log_event(line.level, kComp, line.msg, line.fields);
  const bool from_another = line.is_from_another_rank;
  const Decision& f = release.code != ErrorCode::kOk ? release : r.failure;
  metrics_on_release({.failed = true, .code = f.code, .from_another_rank = from_another, .sent_bytes = sent});
}

void PrefillDriver::take_completions() {
  for (auto& [id, r] : rooms_) {
    if (r.chunk_of_send.empty() || !r.handle) continue;
    for (uint64_t n : r.handle->take_completed_sends()) {
      auto c = r.chunk_of_send.find(n);
      if (c == r.chunk_of_send.end()) continue;
      const uint64_t chunk = c->second;
      r.chunk_of_send.erase(c);
      chunk_send_done(chunk);
    }
  }
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
  auto room = rooms_.find(ch.room);
  if (room == rooms_.end() || !room->second.handle) {
    chunk_send_done(id);
    return;
  }
  Room& r = room->second;
  // On a failed room the send is accepted, writes nothing and ends at once.
  Status s = r.handle->send(ch.pages, layers, {}, ch.last && last_of_chunk);
  if (!s.ok()) {
    r.handle->fail(ErrorCode::kInternal, "send() refused: " + s.str());
    chunk_send_done(id);
    return;
  }
  r.chunk_of_send[r.sends++] = id;
}

void PrefillDriver::submit_fill(uint64_t id) {
  const Chunk& ch = chunks_.at(id);
  const PoolLayout* layout = &manager_.layout();
  uint8_t* base = manager_.pool_base();
  const uint64_t room = ch.room, first_page = ch.first_page;
  const std::vector<uint64_t> pages = ch.pages;
  auto on_error = [this, room, id](const std::string& what) {
    auto r = rooms_.find(room);
    if (r != rooms_.end()) fail_room(r->second, ErrorCode::kInternal, "fill worker: " + what, manager_.self());
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
    if (r.silent || !r.handle) continue;
    const KVPoll p = r.handle->poll();
    if (p == KVPoll::Success || p == KVPoll::Failed) continue;
    while (r.chunks_out < 2 && r.next_page < r.total_pages) {
      uint64_t want = std::min(cfg_.chunk_pages, r.total_pages - r.next_page);
      uint64_t n = std::min(want, staging_.free_pages());
      if (n == 0) return;  // staging pool full: later rooms wait too (FIFO)
      std::vector<uint64_t> pages = std::move(*staging_.alloc(n));
      const uint64_t chunk = next_chunk_++;
      Chunk& ch = chunks_[chunk];
      ch = {id, r.next_page, std::move(pages)};
      r.next_page += n;
      ch.last = r.next_page == r.total_pages;
      ++r.chunks_out;
      if (r.peers.empty()) {  // nothing to write: no content to compute
        send_chunk(chunk, {}, true);
        continue;
      }
      // Layer-wise: one send per layer, each counted down by its completion.
      ch.pending = (cfg_.layerwise ? manager_.layout().model.num_layers : 1);
      submit_fill(chunk);
    }
  }
}

void PrefillDriver::pump(int64_t now_ns) {
  filler_.drain();
  take_completions();
  for (auto& [id, r] : rooms_) {
    if (r.fault_deadline_ns == 0 || now_ns < r.fault_deadline_ns) continue;
    r.fault_deadline_ns = 0;
    if (r.handle && r.handle->poll() == KVPoll::Bootstrapping)
      r.handle->fail(ErrorCode::kBootstrapTimeout,
                     fmt::format("decode's metadata did not come within {} ms (the request's timeout fault)",
                                 cfg_.fault_timeout_ms));
  }
  schedule_chunks();
}

std::vector<RoomReport> PrefillDriver::reports(int64_t now_ns) {
  std::vector<RoomReport> out;
  out.reserve(rooms_.size());
  for (auto& [id, r] : rooms_) {
    RoomReport rep;
    rep.room = id;
    rep.tp_rank = manager_.self().tp_rank;
    std::optional<KVTransferError> e = room_failure(r);
    rep.poll = e ? KVPoll::Failed : r.handle->poll();
    rep.drained = (!r.handle || r.handle->release_safe()) && r.chunks_out == 0;
    const TransferMetrics m = r.handle ? r.handle->metrics() : TransferMetrics{};
    if (e) {
      report_failure(rep, *e);
      rep.failed_ns = m.failed_ns ? m.failed_ns : (r.failed_ns ? r.failed_ns : now_ns);
    }
    rep.send_ns = m.first_send_ns;
    rep.compute_end_ns = r.compute_end_ns;
    rep.bytes = m.bytes;
    out.push_back(std::move(rep));
  }
  return out;
}

std::vector<Decision> PrefillDriver::decide(const std::map<uint64_t, std::vector<RoomReport>>& by_room,
                                            std::vector<RouterRequest> new_requests, int64_t /*now_ns*/,
                                            std::vector<RoomResult>* results) {
  std::vector<Decision> out;
  new_and_aborts(new_requests, manager_.self(), [this](uint64_t id) -> bool* {
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
  return collect_fan_out(rooms_, manager_.self());
}

bool PrefillDriver::on_sibling_failure(const SiblingFailure& f) { return apply_sibling_failure(rooms_, f, kComp); }

RankLeakStats PrefillDriver::leak_stats() const {
  const ManagerStats m = manager_.stats();
  RankLeakStats s = leak_stats_of(manager_.self(), m);
  s.live_rooms = m.live_rooms + rooms_.size();
  s.pages_in_use = staging_.in_use() + m.aux_rows_in_use;
  return s;
}

}  // namespace kvferry
