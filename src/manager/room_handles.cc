// Sender and Receiver (kvferry/manager.h): per-room handles over the manager's prefill or decode
// endpoint. Every call takes the manager's lock; checks come first, so a refused call sends
// nothing. A call on a room that already failed is not an error: it does nothing.
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>

#include "endpoint/topology.h"
#include "kvferry/log.h"
#include "kvferry/routing.h"
#include "manager/manager_internal.h"

namespace kvferry {
namespace {

Status bad(std::string what) { return {ErrorCode::kInvalidArgument, std::move(what)}; }

// fail()'s observation instant: as given if it is in the past and at most kMaxObservedAgeMs old,
// else now (a made-up instant must not win the root-cause rule, nor overflow the wall clock).
int64_t observed_instant(int64_t observed_ns) {
  const int64_t now = monotonic_ns();
  if (observed_ns <= 0 || observed_ns > now || now - observed_ns > kMaxObservedAgeMs * 1'000'000) return now;
  return observed_ns;
}

// Sender/Receiver::fail_from_agreement (kvferry/manager.h): the room's failure here, or its record
// on the failure board, or `fallback`; the board is asked without the manager's lock.
template <typename Handle>
KVTransferError agreement_failure(Handle& h, ManagerImpl& m, uint64_t room, const KVTransferError& fallback,
                                  int64_t wait_ms) {
  if (std::optional<KVTransferError> f = h.failure()) {
    // The room failed here too, but another pair of ranks may have failed it independently, with
    // an earlier cause (each pair then heard only its own): one look at the board, without
    // waiting, and the root-cause rule decides (docs/failure-model.md "Agreement-only ranks").
    std::optional<Failure> posted = m.look_up_failure(room, 0);
    if (!posted || !failure_precedes(*posted, f->failure())) return *f;
    log_event(LogLevel::kDebug, "manager",
              fmt::format("room {}: failed here by {}; the failure board holds an earlier cause: {}", room,
                          f->failure().describe(), posted->describe()),
              failure_log_fields(room, *posted));
    h.fail_from_engine(KVTransferError::from(room, *posted, true));
    return h.failure().value_or(*f);
  }
  std::optional<Failure> posted = m.look_up_failure(room, wait_ms);
  if (std::optional<KVTransferError> f = h.failure()) return *f;  // it reached this rank meanwhile
  KVTransferError e = posted ? KVTransferError::from(room, *posted, true) : fallback;
  e.bootstrap_room = room;
  e.is_from_another_rank = true;
  if (e.first_seen_ns == 0) e.first_seen_ns = monotonic_ns();
  log_event(LogLevel::kDebug, "manager",
            posted ? fmt::format("room {}: failed by the engine's agreement; its root cause from the failure board: {}",
                                 room, posted->describe())
                   : fmt::format("room {}: failed by the engine's agreement; no record on the failure board within "
                                 "{} ms: {}", room, wait_ms, e.str()),
            failure_log_fields(room, e.failure()));
  h.fail_from_engine(e);
  if (std::optional<KVTransferError> f = h.failure()) return *f;
  return e;
}

// The engine saw the room concluded (Success or Failed): its metrics' done instant is now at the
// latest. The progress thread's housekeeping usually sets it first; a poll that concluded the room
// inline (progress_inline) may come before it, and an engine that then closes the room at once
// (SGLang's clear() at Success) must still get its transfer latency. Under the manager's lock.
void note_concluded(ManagerImpl& m, uint64_t room, KVPoll p) {
  ManagerImpl::Room* r = m.room(room);
  if (r != nullptr && r->initialized && r->metrics.done_ns == 0 && (p == KVPoll::Success || p == KVPoll::Failed))
    r->metrics.done_ns = monotonic_ns();
}

// A handle's poll(): the room's state, after taking in what already arrived when it is not
// concluded (ManagerImpl::progress_inline); a poll that sees it conclude sets its done instant.
template <class PollLocked>
KVPoll poll_room(ManagerImpl& m, uint64_t room, const PollLocked& poll_locked) {
  std::lock_guard lock(m.mutex());
  KVPoll p = poll_locked();
  if (p != KVPoll::Success && p != KVPoll::Failed) {
    m.progress_inline();
    p = poll_locked();
  }
  note_concluded(m, room, p);
  return p;
}

class SenderImpl final : public Sender {
 public:
  SenderImpl(ManagerImpl& m, uint64_t room) : m_(m), room_(room) {}
  ~SenderImpl() override {
    std::lock_guard lock(m_.mutex());
    if (ManagerImpl::Room* r = m_.room(room_)) {
      // Dropped before init() without a failure: the engine gave the room up. It fails (aborted,
      // origin this rank) so a decode rank that asked, or asks, is told rather than waiting out
      // its waiting_timeout.
      if (!r->initialized && !r->early_failure)
        (void)m_.open_sender_for_failure(
            room_, *r, Failure{ErrorCode::kAborted, m_.self(), "the sender was dropped before init()", monotonic_ns(), 0},
            true);
      // Dropped in the middle of the room (its last send() not made): decode would wait for the
      // rest until its waiting_timeout; it is told now.
      else if (r->initialized && !r->last_sent && m_.prefill()->poll(room_) != KVPoll::Success &&
               m_.prefill()->poll(room_) != KVPoll::Failed)
        m_.prefill()->fail(room_, ErrorCode::kAborted, "the sender was dropped before its last send()", m_.self(),
                           monotonic_ns(), true);
      r->dropped = true;
    }
    m_.wake();
  }
  uint64_t room() const override { return room_; }

  Status init(uint64_t num_pages, uint64_t aux_index, uint64_t num_tokens) override {
    std::lock_guard lock(m_.mutex());
    ManagerImpl::Room& r = *m_.room(room_);
    const PoolLayout& l = m_.layout();
    if (r.early_failure || (r.initialized && m_.prefill()->poll(room_) == KVPoll::Failed))
      return bad(fmt::format("room {}: init() after the room failed", room_));
    if (r.initialized) return bad(fmt::format("room {}: init() called twice", room_));
    if (num_pages == 0) return bad(fmt::format("room {}: a room needs at least one page", room_));
    // num_pages may exceed this rank's pool: a prefill engine may send a room's pages chunk by
    // chunk from a staging ring it reuses (take_completed_sends).
    if (aux_index >= l.aux_slots)
      return bad(fmt::format("room {}: aux_index {} is out of range: the pool has {} aux rows", room_, aux_index, l.aux_slots));
    if (num_tokens == 0) num_tokens = num_pages * l.page_size;
    if (l.pages_for(num_tokens) != num_pages)
      return bad(fmt::format("room {}: {} tokens take {} pages of {} tokens, not {}", room_, num_tokens,
                             l.pages_for(num_tokens), l.page_size, num_pages));
    // With engine buffers the room's aux row is the engine's; with the contiguous pool kvferry
    // stages the guard record in a row it picks (endpoint/prefill_endpoint.h add_room).
    std::optional<uint64_t> aux;
    if (!m_.config().buffers.empty()) aux = aux_index;
    Status st = m_.prefill()->add_room(room_, num_tokens, aux);
    if (!st.ok()) return st;
    r.initialized = true;
    r.total_pages = num_pages;
    r.next_page.assign(l.model.num_layers, 0);
    m_.wake();
    return Status::Ok();
  }

  Status send(std::span<const uint64_t> pages, std::span<const uint64_t> state_indices, bool last) override {
    return send(pages, LayerRange{}, state_indices, last);
  }

  Status send(std::span<const uint64_t> pages, LayerRange layers, std::span<const uint64_t> state_indices,
              bool last) override {
    std::lock_guard lock(m_.mutex());
    ManagerImpl::Room& r = *m_.room(room_);
    // A send that writes nothing (the room failed) ends at once (take_completed_sends).
    auto ended = [&r] {
      r.completed_sends.push_back(r.sends++);
      return Status::Ok();
    };
    if (r.early_failure) return ended();
    if (!r.initialized) return bad(fmt::format("room {}: send() before init()", room_));
    PrefillEndpoint& ep = *m_.prefill();
    if (ep.poll(room_) == KVPoll::Failed) return ended();
    if (r.last_sent) return bad(fmt::format("room {}: send() after the last chunk", room_));
    if (!state_indices.empty() && !last)
      return bad(fmt::format("room {}: state indices go with the last chunk only", room_));
    if (pages.empty() && !last) return bad(fmt::format("room {}: send() of no pages that is not the last chunk", room_));
    const uint32_t num_layers = static_cast<uint32_t>(r.next_page.size());
    auto range = resolve_layers(layers, num_layers);
    if (!range.ok()) return bad(fmt::format("room {}: {}", room_, range.status().message()));
    const bool all_layers = range->begin == 0 && range->end == num_layers;
    // Each layer sends its pages in token order; a range's layers must stand at the same page
    // (they are written as one chunk), so no layer of a page is ever sent twice.
    const uint64_t first = r.next_page[range->begin];
    for (uint32_t l = range->begin + 1; l < range->end && !pages.empty(); ++l)
      if (r.next_page[l] != first)
        return bad(fmt::format("room {}: layers {} and {} of the range [{}, {}) stand at pages {} and {}: send "
                               "the layers separately",
                               room_, range->begin, l, range->begin, range->end, first, r.next_page[l]));
    const std::string which = all_layers ? "" : fmt::format(" of layers [{}, {})", range->begin, range->end);
    if (first + pages.size() > r.total_pages)
      return bad(fmt::format("room {}: {} pages sent{} plus {} more exceed its {} pages", room_, first, which,
                             pages.size(), r.total_pages));
    // `last`: after this call every page of every layer has been sent.
    for (uint32_t l = 0; last && l < num_layers; ++l) {
      const uint64_t sent = r.next_page[l] + (l >= range->begin && l < range->end ? pages.size() : 0);
      if (sent == r.total_pages) continue;
      const bool uniform = std::all_of(r.next_page.begin(), r.next_page.end(), [&](uint64_t x) { return x == first; });
      if (all_layers && uniform)
        return bad(fmt::format("room {}: the last chunk leaves {} of its {} pages unsent", room_,
                               r.total_pages - sent, r.total_pages));
      return bad(fmt::format("room {}: the last chunk leaves {} of its {} pages of layer {} unsent", room_,
                             r.total_pages - sent, r.total_pages, l));
    }
    const uint64_t num_pages = m_.layout().num_pages;
    std::vector<uint64_t> src(pages.begin(), pages.end());
    for (size_t i = 0; i < src.size(); ++i)
      if (src[i] >= num_pages)
        return bad(fmt::format("room {}: kv_indices[{}] = {} is out of range: the pool has {} pages", room_, i, src[i], num_pages));
    // A room whose heads go to no decode rank (replicated heads) concludes on the last chunk.
    const uint64_t tag = m_.next_tag();
    Status st = ep.send(room_, first, src, tag, state_indices, last, *range);
    if (!st.ok()) return ep.poll(room_) == KVPoll::Failed ? ended() : st;
    if (!src.empty()) ++r.chunks_out;
    // A send ends when its KV writes ended: its pages are not read any more. (The room's aux and
    // state rows go out with the last chunk's writes, or after every KV write: keep them until the
    // room ends.)
    if (!src.empty()) r.send_of_tag.emplace(tag, r.sends++);
    else r.completed_sends.push_back(r.sends++);
    if (r.metrics.first_send_ns == 0) r.metrics.first_send_ns = monotonic_ns();
    for (uint32_t l = range->begin; l < range->end; ++l) r.next_page[l] += src.size();
    r.last_sent = last;
    m_.wake();
    return Status::Ok();
  }

  KVPoll poll() const override {
    return poll_room(m_, room_, [this] { return poll_locked(); });
  }

  KVPoll poll_locked() const {
    const ManagerImpl::Room& r = *m_.room(room_);
    if (r.early_failure) return KVPoll::Failed;
    if (!r.initialized) return m_.prefill()->metadata_complete(room_) ? KVPoll::WaitingForInput : KVPoll::Bootstrapping;
    // A room whose transfer concluded here and that failed since (the engine's failure, told by
    // fail_from_engine): the engine's room failed, so it polls Failed (manager.h).
    const KVPoll p = m_.prefill()->poll(room_);
    return p == KVPoll::Success && m_.core().registry().get(room_) ? KVPoll::Failed : p;
  }

  std::optional<KVTransferError> failure() const override {
    std::lock_guard lock(m_.mutex());
    const ManagerImpl::Room& r = *m_.room(room_);
    if (r.early_failure) return r.early_failure;
    if (!r.initialized) return std::nullopt;
    const KVPoll p = m_.prefill()->poll(room_);
    if (p != KVPoll::Failed && p != KVPoll::Success) return std::nullopt;
    return m_.core().registry().get(room_);
  }

  std::vector<RankId> peers() const override {
    // Its decode instance's ranks once known (its metadata; the only instance); engine 0's before.
    std::lock_guard lock(m_.mutex());
    std::vector<RankId> out = m_.prefill()->destinations(room_);
    if (!out.empty() || dests_of(m_.plan(), m_.self().tp_rank).empty()) return out;
    return m_.prefill()->dests_for(room_, 0);
  }

  void abort(const std::string& reason) override { fail(ErrorCode::kAborted, reason, 0); }

  void fail(ErrorCode code, const std::string& reason, int64_t observed_ns) override {
    std::lock_guard lock(m_.mutex());
    ManagerImpl::Room& r = *m_.room(room_);
    const int64_t now = observed_instant(observed_ns);
    if (!r.initialized && !m_.open_sender_for_failure(room_, r, Failure{code, m_.self(), reason, now, 0}, true)) {
      if (!r.early_failure) r.early_failure = KVTransferError{room_, code, reason, m_.self(), false, now};
    } else {
      m_.prefill()->fail(room_, code, reason, m_.self(), now, true);
    }
    m_.log_if_settled(room_, r, monotonic_ns());  // e.g. no peer involved: settled now
    m_.wake();
  }

  void fail_from_engine(const KVTransferError& e) override {
    std::lock_guard lock(m_.mutex());
    ManagerImpl::Room& r = *m_.room(room_);
    if (!r.initialized && !m_.open_sender_for_failure(room_, r, e.failure(), false)) {
      if (!r.early_failure || failure_precedes(e.failure(), r.early_failure->failure())) {
        r.early_failure = e;
        r.early_failure->bootstrap_room = room_;
        r.early_failure->is_from_another_rank = e.is_from_another_rank || e.origin != m_.self();
      }
    } else {
      m_.prefill()->fail(room_, e.failure(), false);  // the whole record: its wall_ns decides the rule
    }
    m_.wake();
  }

  KVTransferError fail_from_agreement(const KVTransferError& fallback, int64_t wait_ms) override {
    return agreement_failure(*this, m_, room_, fallback, wait_ms);
  }

  bool release_safe() const override {
    std::lock_guard lock(m_.mutex());
    const ManagerImpl::Room& r = *m_.room(room_);
    return !r.initialized || (r.chunks_out == 0 && m_.prefill()->drained(room_));
  }

  TransferMetrics metrics() const override {
    std::lock_guard lock(m_.mutex());
    const ManagerImpl::Room& r = *m_.room(room_);
    TransferMetrics t = r.metrics;
    if (const SenderRoom* s = r.initialized ? m_.prefill()->room(room_) : nullptr) {
      t.bytes = s->bytes;
      t.failed_ns = s->failed_ns;  // the endpoint's instant, not the next progress's
      if (s->failed_ns && (t.done_ns == 0 || s->state.get() == KVPoll::Failed)) t.done_ns = s->failed_ns;
    }
    return t;
  }

  std::vector<uint64_t> take_completed_sends() override {
    std::lock_guard lock(m_.mutex());
    ManagerImpl::Room& r = *m_.room(room_);
    return std::exchange(r.completed_sends, {});
  }

 private:
  ManagerImpl& m_;
  uint64_t room_;
};

class ReceiverImpl final : public Receiver {
 public:
  ReceiverImpl(ManagerImpl& m, uint64_t room) : m_(m), room_(room) {}
  ~ReceiverImpl() override {
    std::lock_guard lock(m_.mutex());
    if (ManagerImpl::Room* r = m_.room(room_)) {
      // Dropped after init() (its sources known) but before send_metadata(), without a failure:
      // the engine gave the request up. Every source is told (aborted, origin this rank) rather
      // than waiting for its bootstrap deadline; no page was given out.
      const KVPoll p = r->initialized ? m_.decode_of(room_)->poll(room_) : KVPoll::Failed;
      if (r->initialized && !r->metadata_sent && p != KVPoll::Failed)
        m_.decode_of(room_)->fail(room_, ErrorCode::kAborted, "the receiver was dropped before send_metadata()", m_.self(),
                          monotonic_ns(), true);
      // Dropped before the room ended: every source stops and is told; the pages may still take a
      // write until the room is release-safe, which take_reclaimed_rooms() then says (manager.h).
      else if (r->metadata_sent && p != KVPoll::Success && p != KVPoll::Failed)
        m_.decode_of(room_)->fail(room_, ErrorCode::kAborted, "the receiver was dropped before the room ended", m_.self(),
                          monotonic_ns(), true);
      r->dropped_unsafe = r->metadata_sent && !m_.decode_of(room_)->drained(room_, monotonic_ns());
      r->dropped = true;
    }
    m_.wake();
  }
  uint64_t room() const override { return room_; }

  Status init(int64_t prefill_dp_rank) override {
    std::lock_guard lock(m_.mutex());
    ManagerImpl::Room& r = *m_.room(room_);
    if (r.dp_set || r.metadata_sent)
      return bad(fmt::format("room {}: init() called twice or after send_metadata()", room_));
    const uint32_t dp = m_.config().peer_dp_size;
    if (prefill_dp_rank < -1 || prefill_dp_rank >= static_cast<int64_t>(dp))
      return bad(fmt::format("room {}: prefill_dp_rank {} is outside the prefill engine's DP size {}", room_,
                             prefill_dp_rank, dp));
    r.dp_set = true;
    r.prefill_dp_rank = prefill_dp_rank;
    // The room's sources are known now: the room goes into the endpoint (no pages yet), so a
    // source's failure, or its death, reaches the receiver while the engine waits for memory,
    // and the sources are told of a failure here at once.
    if (!r.early_failure) {
      m_.decode_of(room_)->add_room(room_, 0, prefill_dp_rank);
      r.initialized = true;
    }
    m_.wake();
    return Status::Ok();
  }

  Status send_metadata(std::span<const uint64_t> pages, uint64_t aux_index, std::span<const uint64_t> state_indices,
                       uint64_t num_tokens) override {
    std::lock_guard lock(m_.mutex());
    ManagerImpl::Room& r = *m_.room(room_);
    const PoolLayout& l = m_.layout();
    if (r.metadata_sent || r.early_failure)
      return bad(fmt::format("room {}: send_metadata() called twice or after abort", room_));
    if (pages.empty()) return bad(fmt::format("room {}: a room needs at least one page", room_));
    if (num_tokens == 0) num_tokens = pages.size() * l.page_size;
    if (l.pages_for(num_tokens) != pages.size())
      return bad(fmt::format("room {}: {} tokens take {} pages of {} tokens, not {}", room_, num_tokens,
                             l.pages_for(num_tokens), l.page_size, pages.size()));
    if (aux_index >= l.aux_slots)
      return bad(fmt::format("room {}: aux_index {} is out of range: the pool has {} aux rows", room_, aux_index, l.aux_slots));
    std::vector<uint64_t> dst(pages.begin(), pages.end());
    std::set<uint64_t> seen;
    for (size_t i = 0; i < dst.size(); ++i) {
      if (dst[i] >= l.num_pages)
        return bad(fmt::format("room {}: kv_indices[{}] = {} is out of range: the pool has {} pages", room_, i, dst[i], l.num_pages));
      if (!seen.insert(dst[i]).second) return bad(fmt::format("room {}: kv_indices[{}] = {} appears twice", room_, i, dst[i]));
    }
    DecodeEndpoint& ep = *m_.decode_of(room_);
    const bool opened = r.initialized;  // by init()
    ep.add_room(room_, num_tokens, r.prefill_dp_rank);  // sizes a room init() opened
    r.initialized = true;
    r.metadata_sent = true;
    r.total_pages = dst.size();
    r.metrics.metadata_ns = monotonic_ns();
    r.metrics.bytes = l.bytes_for_pages(dst.size());
    Status s = ep.init(room_, dst, aux_index, state_indices);
    if (!s.ok() && s.code() == ErrorCode::kInvalidArgument) {  // refused: nothing was sent
      if (!opened) {
        ep.release(room_);
        r.initialized = false;
      }
      r.metadata_sent = false;
      return s;
    }
    m_.wake();
    return s;
  }

  KVPoll poll() const override {
    return poll_room(m_, room_, [this] { return poll_locked(); });
  }

  KVPoll poll_locked() const {
    const ManagerImpl::Room& r = *m_.room(room_);
    if (r.early_failure) return KVPoll::Failed;
    if (!r.initialized) return KVPoll::Bootstrapping;
    // A room whose transfer concluded here and that failed since (the engine's failure, told by
    // fail_from_engine): the engine's room failed, so it polls Failed (manager.h).
    const KVPoll p = m_.decode_of(room_)->poll(room_);
    return p == KVPoll::Success && m_.core().registry().get(room_) ? KVPoll::Failed : p;
  }

  std::optional<KVTransferError> failure() const override {
    std::lock_guard lock(m_.mutex());
    const ManagerImpl::Room& r = *m_.room(room_);
    if (r.early_failure) return r.early_failure;
    if (!r.initialized) return std::nullopt;
    const KVPoll p = m_.decode_of(room_)->poll(room_);
    if (p != KVPoll::Failed && p != KVPoll::Success) return std::nullopt;
    return m_.core().registry().get(room_);
  }

  std::vector<RankId> peers() const override {
    std::lock_guard lock(m_.mutex());
    const ManagerImpl::Room& r = *m_.room(room_);
    std::vector<RankId> out;
    if (!r.dp_set) return out;
    const uint32_t dp = r.prefill_dp_rank >= 0 ? static_cast<uint32_t>(r.prefill_dp_rank)
                                               : dp_rank_for_room(room_, m_.config().peer_dp_size);
    for (uint32_t p : sources_of(m_.plan(), m_.self().tp_rank)) out.push_back({Role::kPrefill, 0, p, dp});
    return out;
  }

  void abort(const std::string& reason) override { fail(ErrorCode::kAborted, reason, 0); }

  void fail(ErrorCode code, const std::string& reason, int64_t observed_ns) override {
    std::lock_guard lock(m_.mutex());
    ManagerImpl::Room& r = *m_.room(room_);
    const int64_t now = observed_instant(observed_ns);
    if (!r.initialized && !open_for_failure(r)) {
      if (!r.early_failure) r.early_failure = KVTransferError{room_, code, reason, m_.self(), false, now};
    } else {
      m_.decode_of(room_)->fail(room_, code, reason, m_.self(), now, true);
    }
    m_.log_if_settled(room_, r, monotonic_ns());  // e.g. no peer involved: settled now
    m_.wake();
  }

  void fail_from_engine(const KVTransferError& e) override {
    std::lock_guard lock(m_.mutex());
    ManagerImpl::Room& r = *m_.room(room_);
    if (!r.initialized && !open_for_failure(r)) {
      if (!r.early_failure || failure_precedes(e.failure(), r.early_failure->failure())) {
        r.early_failure = e;
        r.early_failure->bootstrap_room = room_;
        r.early_failure->is_from_another_rank = e.is_from_another_rank || e.origin != m_.self();
      }
    } else {
      m_.decode_of(room_)->fail(room_, e.failure(), false);  // the whole record: its wall_ns decides the rule
    }
    m_.wake();
  }

  KVTransferError fail_from_agreement(const KVTransferError& fallback, int64_t wait_ms) override {
    return agreement_failure(*this, m_, room_, fallback, wait_ms);
  }

  bool release_safe() const override {
    std::lock_guard lock(m_.mutex());
    const ManagerImpl::Room& r = *m_.room(room_);
    return !r.initialized || m_.decode_of(room_)->drained(room_, monotonic_ns());
  }

  bool quarantined() const override {
    std::lock_guard lock(m_.mutex());
    const ManagerImpl::Room& r = *m_.room(room_);
    if (!r.initialized || !m_.decode_of(room_)->drained(room_, monotonic_ns())) return false;
    const ReceiverRoom* rr = m_.decode_of(room_)->room(room_);
    if (!rr || rr->failed_ns == 0) return false;
    for (const RankId& src : rr->metadata_sent)
      if (!rr->terminal.count(src)) return true;
    return false;
  }

  TransferMetrics metrics() const override {
    std::lock_guard lock(m_.mutex());
    const ManagerImpl::Room& r = *m_.room(room_);
    TransferMetrics t = r.metrics;
    // The endpoint's instants, not the next progress's.
    if (const ReceiverRoom* rr = r.initialized ? m_.decode_of(room_)->room(room_) : nullptr) {
      t.failed_ns = rr->failed_ns;  // also a room that failed after it concluded here
      t.done_ns = rr->success_ns ? rr->success_ns : rr->failed_ns;
    }
    return t;
  }

 private:
  // A failure after init() and before send_metadata() (SGLang: the request was aborted while it
  // waited for memory): the room's sources are known, so the room goes into the endpoint without
  // pages and every source is told now; prefill fails the room with this cause at once instead of
  // at its bootstrap deadline. No page was given out: release-safe at once. True if it did.
  bool open_for_failure(ManagerImpl::Room& r) {
    if (r.initialized) return true;  // init() opened it
    if (!r.dp_set || r.early_failure) return false;
    m_.decode_of(room_)->add_room(room_, 0, r.prefill_dp_rank);
    r.initialized = true;
    return true;
  }

  ManagerImpl& m_;
  uint64_t room_;
};

}  // namespace

Result<std::unique_ptr<Sender>> ManagerImpl::sender(uint64_t id) {
  std::lock_guard lock(mu_);
  if (!prefill_) return bad(fmt::format("sender(room {}) on a decode manager: senders are prefill's", id));
  if (leaving_) return refuse_leaving("sender", id);
  auto [it, added] = rooms_.try_emplace(id);
  if (!added)
    return bad(fmt::format("room {} already has a sender on {} (or it is still being released)", id, self().str()));
  it->second.metrics.created_ns = monotonic_ns();
  // Bound for a decode rank refused as incompatible (kvferry/compat.h): failed before init().
  if (std::optional<Failure> f = prefill_->incompatible_destination(id); f && !open_sender_for_failure(id, it->second, *f, false))
    it->second.early_failure = KVTransferError::from(id, *f, true);
  return std::unique_ptr<Sender>(new SenderImpl(*this, id));
}

Result<std::unique_ptr<Receiver>> ManagerImpl::receiver(uint64_t id, const std::string& prefill_bootstrap) {
  std::unique_lock lock(mu_);
  if (!decoding_) return bad(fmt::format("receiver(room {}) on a prefill manager: receivers are decode's", id));
  if (leaving_) return refuse_leaving("receiver", id);
  auto taken = [&] {
    return bad(fmt::format("room {} already has a receiver on {} (or it is still being released)", id, self().str()));
  };
  if (rooms_.count(id)) return taken();
  const std::string address = prefill_bootstrap.empty() ? config_.bootstrap_address : prefill_bootstrap;
  if (address.empty())
    return bad(fmt::format("receiver(room {}): no prefill bootstrap address (none given, none configured)", id));
  ++receivers_in_progress_;  // drained() is false meanwhile
  Result<DecodeEndpoint*> ep = prefill_instance(address, lock);  // may wait for a lookup, unlocked
  --receivers_in_progress_;
  if (!ep.ok()) return ep.status();
  if (leaving_) return refuse_leaving("receiver", id);  // leave() came while the lookup ran
  if (rooms_.count(id)) return taken();  // another call took the room while the lookup ran
  Room& r = rooms_[id];
  r.metrics.created_ns = monotonic_ns();
  r.instance = address;
  r.ep = *ep;
  PrefillInstance& inst = instances_.at(address);
  ++inst.rooms;
  inst.idle_since_ns = 0;
  return std::unique_ptr<Receiver>(new ReceiverImpl(*this, id));
}

}  // namespace kvferry
