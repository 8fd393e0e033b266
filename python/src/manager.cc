#include "manager.h"

#include <fmt/format.h>

#include <algorithm>

#include <cstring>
#include <utility>

#include "kvferry/fault_transport.h"
#include "kvferry/log.h"

namespace kvferry::python {
namespace {

Status bad(std::string what) { return {ErrorCode::kInvalidArgument, std::move(what)}; }

// Python ints to page or row indices; a negative one is refused naming it.
Result<std::vector<uint64_t>> indices(const std::vector<int64_t>& v, const char* what) {
  std::vector<uint64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0) return bad(fmt::format("{}[{}] = {} is negative", what, i, v[i]));
    out.push_back(static_cast<uint64_t>(v[i]));
  }
  return out;
}

}  // namespace

Result<PoolLayout> layout_for_pages(const ConnectorConfig& c, uint64_t num_pages) {
  if (c.page_size == 0) return bad("page_size must be at least 1 token");
  // A layout as large as needed, then cut to `num_pages`.
  auto l = make_layout(c.model, c.tp_size, c.tp_rank, c.page_size, ~0ull >> 8, c.aux_slots);
  if (!l.ok()) return l.status();
  l->num_pages = num_pages;
  return l;
}

Result<std::unique_ptr<Connector>> Connector::create(const ConnectorConfig& c) {
  std::unique_ptr<Connector> m(new Connector());
  m->self_ = RankId{c.role, c.engine_id, c.tp_rank, c.dp_rank};
  if (c.buffers.empty()) {
    if (c.pool == nullptr || c.pool_bytes == 0) return bad("no memory: give a KV pool or engine buffers");
    auto layout = make_layout(c.model, c.tp_size, c.tp_rank, c.page_size, c.pool_bytes, c.aux_slots);
    if (!layout.ok())
      return Status(layout.status().code(),
                    fmt::format("KV pool of {} bytes: {}", c.pool_bytes, layout.status().message()));
  } else if (c.pool != nullptr) {
    return bad("give a KV pool or engine buffers, not both");
  }
  if (!c.log_file.empty()) init_logging({m->self_.str(), c.log_file, LogLevel::kDebug, LogLevel::kWarning});
  kvferry::ManagerConfig mc;
  mc.self = m->self_;
  mc.tp_size = c.tp_size;
  mc.peer_tp_size = c.peer_tp_size;
  mc.peer_dp_size = c.peer_dp_size;
  mc.model = c.model;
  mc.page_size = c.page_size;
  mc.buffers = c.buffers;
  if (c.buffers.empty()) {
    mc.pool_base = c.pool;
    mc.pool_bytes = c.pool_bytes;
  }
  mc.aux_rows = c.aux_slots;
  mc.control = make_listen_address(c.control_bind, c.control_advertise, c.control_port);
  mc.bootstrap_address = c.bootstrap;
  mc.transport = c.transport;
  mc.transfer_shards = c.transfer_shards;
  mc.deadlines = c.deadlines;
  mc.progress_thread = true;
  mc.fault_injection = c.fault_injection;  // inject_write_failure, hold_writes: only when asked for
  mc.integrity = c.integrity;
  if (c.log_failures) mc.failure_log_component = c.role == Role::kPrefill ? "prefill.connector" : "decode.connector";
  auto r = kvferry::Manager::create(mc);
  if (!r.ok()) return r.status();
  m->m_ = std::move(r).value();
  m->layout_ = m->m_->layout();
  return m;
}

Connector::~Connector() { close(); }

std::string Connector::control_endpoint() {
  std::lock_guard lock(mu_);
  return m_ ? m_->control_endpoint() : std::string();
}

void Connector::close() {
  std::unique_lock lock(mu_);
  agreements_done_.wait(lock, [this] { return agreements_waiting_ == 0; });
  rooms_.clear();  // handles before their manager
  m_.reset();      // the transport goes before the engine may free the pool
}

Connector::Room* Connector::find(uint64_t room) {
  auto it = rooms_.find(room);
  return it == rooms_.end() ? nullptr : &it->second;
}

Status Connector::open(uint64_t room, const std::string& prefill_bootstrap, int64_t prefill_dp_rank) {
  std::lock_guard lock(mu_);
  if (!m_) return bad("the manager is closed");
  if (rooms_.count(room)) return bad(fmt::format("room {} is already open on {}", room, self_.str()));
  Room r;
  if (self_.role == Role::kPrefill) {
    auto s = m_->sender(room);
    if (!s.ok()) return s.status();
    r.sender = std::move(s).value();
  } else {
    auto s = m_->receiver(room, prefill_bootstrap);
    if (!s.ok()) return s.status();
    if (Status st = (*s)->init(prefill_dp_rank); !st.ok()) return st;
    r.receiver = std::move(s).value();
  }
  rooms_.emplace(room, std::move(r));
  return Status::Ok();
}

Status Connector::sender_init(uint64_t room, uint64_t num_pages, int64_t aux_index, uint64_t num_tokens) {
  std::lock_guard lock(mu_);
  if (self_.role != Role::kPrefill) return bad("init(num_kv_indices) is a prefill (sender) call");
  Room* r = find(room);
  if (!r) return bad(fmt::format("room {} is not open", room));
  if (aux_index < 0) return bad(fmt::format("aux_index {} is negative", aux_index));
  Status s = r->sender->init(num_pages, static_cast<uint64_t>(aux_index), num_tokens);
  if (s.ok()) {
    r->total_pages = num_pages;
    r->next_page.assign(layout_.model.num_layers, 0);
  }
  return s;
}

Status Connector::sender_send(uint64_t room, const std::vector<int64_t>& pages, const std::vector<int64_t>& state,
                              std::optional<bool> last, std::optional<std::pair<int64_t, int64_t>> layers) {
  std::lock_guard lock(mu_);
  if (self_.role != Role::kPrefill) return bad("send(kv_indices) is a prefill (sender) call");
  Room* r = find(room);
  if (!r || r->total_pages == 0) return bad(fmt::format("room {}: send() before init()", room));
  auto src = indices(pages, "kv_indices");
  if (!src.ok()) return src.status();
  auto rows = indices(state, "state_indices");
  if (!rows.ok()) return rows.status();
  const uint32_t num_layers = static_cast<uint32_t>(r->next_page.size());
  LayerRange range;  // every layer
  if (layers) {
    const auto [b, e] = *layers;
    if (b < 0 || e < 0 || b >= e || e > static_cast<int64_t>(num_layers))
      return bad(fmt::format("room {}: layers ({}, {}) is not a range [begin, end) of the model's {} layers", room, b, e,
                             num_layers));
    range = {static_cast<uint32_t>(b), static_cast<uint32_t>(e)};
  }
  const uint32_t end = std::min(range.end, num_layers);
  bool complete = true;  // after this chunk, every page of every layer was sent
  for (uint32_t l = 0; l < num_layers; ++l)
    complete &= r->next_page[l] + (l >= range.begin && l < end ? src->size() : 0) == r->total_pages;
  const bool is_last = last.value_or(complete);
  Status s = r->sender->send(*src, range, *rows, is_last);
  if (s.ok())
    for (uint32_t l = range.begin; l < end; ++l) r->next_page[l] += src->size();
  return s;
}

Status Connector::receiver_init(uint64_t room, const std::vector<int64_t>& kv, int64_t aux_slot,
                                const std::vector<int64_t>& state, uint64_t num_tokens) {
  std::lock_guard lock(mu_);
  if (self_.role != Role::kDecode) return bad("init(kv_indices, aux_index) is a decode (receiver) call");
  Room* r = find(room);
  if (!r) return bad(fmt::format("room {} is not open", room));
  if (aux_slot < 0) return bad(fmt::format("aux_index {} is negative", aux_slot));
  auto dst = indices(kv, "kv_indices");
  if (!dst.ok()) return dst.status();
  auto rows = indices(state, "state_indices");
  if (!rows.ok()) return rows.status();
  return r->receiver->send_metadata(*dst, static_cast<uint64_t>(aux_slot), *rows, num_tokens);
}

Result<std::vector<uint64_t>> Connector::take_completed_sends(uint64_t room) {
  std::lock_guard lock(mu_);
  Room* r = find(room);
  if (!r) return bad(fmt::format("room {} is not open", room));
  if (!r->sender) return bad("take_completed_sends() is a prefill (sender) call");
  return r->sender->take_completed_sends();
}

Result<bool> Connector::release_safe(uint64_t room) {
  std::lock_guard lock(mu_);
  Room* r = find(room);
  if (!r) return bad(fmt::format("room {} is not open", room));
  return r->sender ? r->sender->release_safe() : r->receiver->release_safe();
}

Result<bool> Connector::quarantined(uint64_t room) {
  std::lock_guard lock(mu_);
  Room* r = find(room);
  if (!r) return bad(fmt::format("room {} is not open", room));
  return r->receiver ? r->receiver->quarantined() : false;
}

Status Connector::fail_from_engine(uint64_t room, ErrorCode code, const std::string& reason, const RankId& origin) {
  std::lock_guard lock(mu_);
  Room* r = find(room);
  if (!r) return bad(fmt::format("room {} is not open", room));
  const KVTransferError e{room, code, reason, origin, !(origin == self_), monotonic_ns()};
  if (r->sender) r->sender->fail_from_engine(e);
  else r->receiver->fail_from_engine(e);
  return Status::Ok();
}

Result<KVTransferError> Connector::fail_from_agreement(uint64_t room, ErrorCode code, const std::string& reason,
                                                      int64_t wait_ms) {
  std::shared_ptr<Sender> sender;
  std::shared_ptr<Receiver> receiver;
  {
    std::lock_guard lock(mu_);
    Room* r = find(room);
    if (!r) return bad(fmt::format("room {} is not open", room));
    sender = r->sender;
    receiver = r->receiver;
    ++agreements_waiting_;
  }
  // The wait for the failure board runs without this connector's lock: the manager's other calls,
  // from other threads, go on meanwhile (kvferry/manager.h: the lock is not held while it waits).
  // close() waits for it (the handle must not outlive the manager).
  const KVTransferError e{room, code, reason, self_, true, monotonic_ns()};  // the fallback
  KVTransferError out = sender ? sender->fail_from_agreement(e, wait_ms) : receiver->fail_from_agreement(e, wait_ms);
  sender.reset();  // a room closed meanwhile is dropped here, while the manager still lives
  receiver.reset();
  {
    std::lock_guard lock(mu_);
    --agreements_waiting_;
  }
  agreements_done_.notify_all();
  return out;
}

KVPoll Connector::poll(uint64_t room) {
  std::lock_guard lock(mu_);
  Room* r = find(room);
  if (!r) return KVPoll::Failed;
  return r->sender ? r->sender->poll() : r->receiver->poll();
}

Result<TransferMetrics> Connector::metrics(uint64_t room) {
  std::lock_guard lock(mu_);
  Room* r = find(room);
  if (!r) {
    if (auto c = closed_metrics_.find(room); c != closed_metrics_.end()) return c->second;
    return bad(fmt::format("room {} is not open", room));
  }
  return r->sender ? r->sender->metrics() : r->receiver->metrics();
}

std::optional<KVTransferError> Connector::failure(uint64_t room) {
  std::lock_guard lock(mu_);
  Room* r = find(room);
  if (!r) return std::nullopt;
  return r->sender ? r->sender->failure() : r->receiver->failure();
}

Status Connector::abort(uint64_t room, const std::string& reason) {
  std::lock_guard lock(mu_);
  Room* r = find(room);
  if (!r) return bad(fmt::format("room {} is not open", room));
  if (r->sender) r->sender->abort(reason);
  else r->receiver->abort(reason);
  return Status::Ok();
}

Status Connector::fail_local(uint64_t room, ErrorCode code, const std::string& reason) {
  std::lock_guard lock(mu_);
  Room* r = find(room);
  if (!r) return bad(fmt::format("room {} is not open", room));
  if (r->sender) r->sender->fail(code, reason);
  else r->receiver->fail(code, reason);
  return Status::Ok();
}

void Connector::close_room(uint64_t room) {
  std::lock_guard lock(mu_);
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return;
  const Room& r = it->second;
  if (!closed_metrics_.count(room)) {
    if (closed_order_.size() >= kMaxClosedMetrics) {
      closed_metrics_.erase(closed_order_.front());
      closed_order_.pop_front();
    }
    closed_order_.push_back(room);
  }
  closed_metrics_[room] = r.sender ? r.sender->metrics() : r.receiver->metrics();
  rooms_.erase(it);  // the manager releases it once no write can reach its pages
}

Status Connector::no_faults() const {
  return {ErrorCode::kInvalidArgument,
          "fault injection is off: build the manager with fault_injection=True (kvferry.sglang: "
          "KVFERRY_FAULT_INJECTION=1)"};
}

Status Connector::inject_write_failure(uint64_t room, ErrorCode code, const std::string& reason) {
  std::lock_guard lock(mu_);
  if (!m_ || !m_->faults()) return no_faults();
  m_->faults()->fail_room(room, code, reason);
  return Status::Ok();
}

Status Connector::corrupt_next_write(uint64_t room) {
  std::lock_guard lock(mu_);
  if (!m_ || !m_->faults()) return no_faults();
  m_->faults()->corrupt_next_write(room);
  return Status::Ok();
}

Status Connector::hold_writes(uint64_t room) {
  std::lock_guard lock(mu_);
  if (!m_ || !m_->faults()) return no_faults();
  m_->faults()->hold_room(room);
  return Status::Ok();
}

Status Connector::release_held_writes(uint64_t room) {
  std::lock_guard lock(mu_);
  if (!m_ || !m_->faults()) return no_faults();
  m_->faults()->release_held(room);
  return Status::Ok();
}

Result<size_t> Connector::held_writes(uint64_t room) {
  std::lock_guard lock(mu_);
  if (!m_ || !m_->faults()) return no_faults();
  return m_->faults()->queued_writes(room);
}

Result<AuxRecord> Connector::aux(int64_t slot) {
  std::lock_guard lock(mu_);
  if (!m_) return bad("the manager is closed");
  if (m_->pool_base() == nullptr) return bad("aux(): with engine buffers, read the engine's aux buffers");
  if (slot < 0 || static_cast<uint64_t>(slot) >= layout_.aux_slots)
    return bad(fmt::format("aux slot {} is out of range ({} slots)", slot, layout_.aux_slots));
  AuxRecord rec;
  std::memcpy(&rec, m_->pool_base() + layout_.aux_offset(static_cast<uint32_t>(slot)), sizeof rec);
  return rec;
}

size_t Connector::live_rooms() {
  std::lock_guard lock(mu_);
  return m_ ? m_->stats().live_rooms : 0;
}

std::vector<uint64_t> Connector::take_reclaimed_rooms() {
  std::lock_guard lock(mu_);
  return m_ ? m_->take_reclaimed_rooms() : std::vector<uint64_t>{};
}

Status Connector::leave(int64_t timeout_ms) {
  kvferry::Manager* m = nullptr;
  {
    std::lock_guard lock(mu_);
    if (!m_) return Status(ErrorCode::kInvalidArgument, "leave(): the manager is closed");
    m = m_.get();
    ++agreements_waiting_;  // close() waits for this call too
  }
  Status s = m->leave(timeout_ms);  // without mu_: it may wait for the bootstrap service
  {
    std::lock_guard lock(mu_);
    --agreements_waiting_;
  }
  agreements_done_.notify_all();
  return s;
}

bool Connector::drained() {
  std::lock_guard lock(mu_);
  return !m_ || (rooms_.empty() && m_->drained());
}

size_t Connector::peers() {
  std::lock_guard lock(mu_);
  return m_ ? m_->stats().peers : 0;
}

}  // namespace kvferry::python
