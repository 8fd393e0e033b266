#include "manager.h"

#include <fmt/format.h>

#include <cstring>
#include <set>
#include <utility>

#include "driver/log_policy.h"
#include "endpoint/topology.h"
#include "kvferry/bootstrap.h"
#include "kvferry/log.h"
#include "kvferry/messages.h"

namespace kvferry::python {
namespace {
constexpr int kLoopWakeMs = 5;  // longest sleep of the progress thread without any event

std::string_view component(Role role) { return role == Role::kPrefill ? "prefill.connector" : "decode.connector"; }

Status bad(std::string what) { return {ErrorCode::kInvalidArgument, std::move(what)}; }
}  // namespace

Result<PoolLayout> layout_for_pages(const ManagerConfig& c, uint64_t num_pages) {
  if (c.page_size == 0) return bad("page_size must be at least 1 token");
  // A layout as large as needed, then cut to `num_pages`.
  auto l = make_layout(c.model, c.tp_size, c.tp_rank, c.page_size, ~0ull >> 8, c.aux_slots);
  if (!l.ok()) return l.status();
  l->num_pages = num_pages;
  return l;
}

Result<std::unique_ptr<Manager>> Manager::create(const ManagerConfig& c) {
  std::unique_ptr<Manager> m(new Manager());
  m->config_ = c;
  m->self_ = RankId{c.role, 0, c.tp_rank, 0};
  if (c.pool == nullptr || c.pool_bytes == 0) return bad("the KV pool is empty");
  if (c.page_size == 0) return bad("page_size must be at least 1 token");
  auto layout = make_layout(c.model, c.tp_size, c.tp_rank, c.page_size, c.pool_bytes, c.aux_slots);
  if (!layout.ok()) return Status(layout.status().code(), "KV pool of " + std::to_string(c.pool_bytes) +
                                                              " bytes: " + layout.status().message());
  m->layout_ = *layout;
  const uint32_t peer_tp = c.peer_tp_size ? c.peer_tp_size : c.tp_size;
  const uint32_t prefill_tp = c.role == Role::kPrefill ? c.tp_size : peer_tp;
  const uint32_t decode_tp = c.role == Role::kPrefill ? peer_tp : c.tp_size;
  auto plan = plan_transfers(c.model, prefill_tp, decode_tp);
  if (!plan.ok()) return plan.status();
  if (!c.log_file.empty()) init_logging({m->self_.str(), c.log_file, LogLevel::kDebug, LogLevel::kWarning});

  EndpointConfig ec;
  ec.self = m->self_;
  ec.layout = m->layout_;
  ec.transport = c.transport;
  ec.transfer_shards = c.transfer_shards;
  ec.deadlines = c.deadlines;
  ec.external_base = c.pool;
  ec.external_bytes = c.pool_bytes;
  auto core = EndpointCore::create(ec);
  if (!core.ok()) return core.status();
  m->core_ = std::move(core).value();
  BootstrapClient bootstrap(c.bootstrap, 2000);
  if (c.role == Role::kPrefill) {
    PrefillRankInfo info;
    info.tp_rank = c.tp_rank;
    info.tp_size = c.tp_size;
    info.host = "127.0.0.1";
    info.control_endpoint = m->core_->control().endpoint();
    info.page_size = c.page_size;
    info.dtype = fmt::format("{}-byte", c.model.dtype_bytes);
    info.model = c.model.name;
    info.num_layers = c.model.num_layers;
    info.heads_per_rank = m->layout_.heads_per_rank;
    info.first_head = m->layout_.first_head;
    Status s = bootstrap.register_rank(info);
    if (!s.ok()) return Status(s.code(), "bootstrap registration at " + c.bootstrap + ": " + s.message());
    m->prefill_ = std::make_unique<PrefillEndpoint>(*m->core_, *plan);
  } else {
    m->decode_ = std::make_unique<DecodeEndpoint>(*m->core_, *plan, c.bootstrap);
    Status s = m->decode_->connect_peers(bootstrap, monotonic_ns() + c.deadlines.lookup_timeout_ms * 1'000'000);
    if (!s.ok()) return s;
  }
  log_event(LogLevel::kDebug, component(c.role),
            fmt::format("manager up: {} pages of {} tokens, {} buffers, pool {} bytes, transport {}",
                        m->layout_.num_pages, m->layout_.page_size, m->layout_.num_buffers(), c.pool_bytes,
                        c.transport));
  m->thread_ = std::thread([raw = m.get()] { raw->run(); });
  return m;
}

Manager::~Manager() { close(); }

void Manager::close() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  prefill_.reset();
  decode_.reset();
  core_.reset();  // the transport goes before the engine may free the pool
  rooms_.clear();
}

void Manager::run() {
  while (!stop_) {
    int fds[2] = {core_->waker().fd(), core_->control().fd()};
    wait_readable(fds, 2, kLoopWakeMs);
    core_->waker().drain();
    std::lock_guard lock(mu_);
    pump_locked(monotonic_ns());
  }
}

void Manager::pump_locked(int64_t now) {
  for (int i = 0; i < 4096; ++i) {
    auto frame = core_->control().recv(std::chrono::milliseconds(0));
    if (!frame) break;
    auto msg = decode(*frame);
    if (!msg.ok()) {
      log_event(LogLevel::kWarning, "control", "rejected control frame: " + msg.status().str(),
                {.code = std::string(code_name(ErrorCode::kProtocolError))});
      continue;
    }
    if (prefill_) prefill_->on_message(*msg);
    else decode_->on_message(*msg);
  }
  for (const TransportEvent& e : core_->take_events())
    if (prefill_) (void)prefill_->on_transport_event(e);
  if (prefill_) prefill_->tick(now);
  else decode_->tick(now);
  for (auto it = rooms_.begin(); it != rooms_.end();) {
    const uint64_t id = it->first;
    Room& r = it->second;
    if (r.initialized && !r.logged && poll_locked(id, r) == KVPoll::Failed) {
      if (auto e = core_->registry().get(id)) log_failure_locked(id, *e);
      r.logged = true;
    }
    bool drained = !r.initialized || (prefill_ ? prefill_->drained(id) : decode_->drained(id, now));
    if (r.closing && drained) {
      if (r.initialized) {
        if (prefill_) prefill_->release(id);
        else decode_->release(id);
        core_->faults().clear_room(id);
      }
      it = rooms_.erase(it);
      continue;
    }
    ++it;
  }
}

void Manager::log_failure_locked(uint64_t room, const KVTransferError& e) {
  LogLevel level = failure_log_level(self_.role, e.is_from_another_rank, e.code);
  log_event(level, component(self_.role), e.str(),
            {.room = room, .code = std::string(code_name(e.code)), .origin = e.origin.str(),
             .extra = {{"is_from_another_rank", e.is_from_another_rank ? "true" : "false"}}});
}

Status Manager::open(uint64_t room) {
  std::lock_guard lock(mu_);
  if (!core_) return bad("the manager is closed");
  auto [it, added] = rooms_.try_emplace(room);
  if (!added) return bad(fmt::format("room {} is already open on {}", room, self_.str()));
  return Status::Ok();
}

Status Manager::sender_init(uint64_t room, uint64_t num_pages, uint64_t num_tokens) {
  std::lock_guard lock(mu_);
  if (!prefill_) return bad("init(num_kv_indices) is a prefill (sender) call");
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return bad(fmt::format("room {} is not open", room));
  Room& r = it->second;
  if (r.initialized || r.early_failure) return bad(fmt::format("room {}: init() called twice or after abort", room));
  if (num_pages == 0) return bad("a room needs at least one page");
  if (num_tokens == 0) num_tokens = num_pages * layout_.page_size;
  if (layout_.pages_for(num_tokens) != num_pages)
    return bad(fmt::format("{} tokens take {} pages of {} tokens, not {}", num_tokens, layout_.pages_for(num_tokens),
                           layout_.page_size, num_pages));
  prefill_->add_room(room, num_tokens);
  r.initialized = true;
  r.total_pages = num_pages;
  return Status::Ok();
}

Status Manager::sender_send(uint64_t room, const std::vector<int64_t>& pages) {
  std::lock_guard lock(mu_);
  if (!prefill_) return bad("send(kv_indices) is a prefill (sender) call");
  auto it = rooms_.find(room);
  if (it == rooms_.end() || !it->second.initialized) return bad(fmt::format("room {}: send() before init()", room));
  Room& r = it->second;
  if (pages.empty()) return bad("send() of no pages");
  if (r.next_page + pages.size() > r.total_pages)
    return bad(fmt::format("room {}: {} pages sent plus {} more exceed its {} pages", room, r.next_page, pages.size(),
                           r.total_pages));
  std::vector<uint64_t> src;
  src.reserve(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || static_cast<uint64_t>(pages[i]) >= layout_.num_pages)
      return bad(fmt::format("kv_indices[{}] = {} is out of range: the pool has {} pages", i,
                                 pages[i], layout_.num_pages));
    src.push_back(static_cast<uint64_t>(pages[i]));
  }
  Status s = prefill_->send(room, r.next_page, src, next_tag_++);
  if (!s.ok()) return s;
  r.next_page += pages.size();
  core_->waker().signal();
  return Status::Ok();
}

Status Manager::receiver_init(uint64_t room, const std::vector<int64_t>& kv, int64_t aux_slot, uint64_t num_tokens) {
  std::lock_guard lock(mu_);
  if (!decode_) return bad("init(kv_indices, aux_index) is a decode (receiver) call");
  auto it = rooms_.find(room);
  if (it == rooms_.end()) return bad(fmt::format("room {} is not open", room));
  Room& r = it->second;
  if (r.initialized || r.early_failure) return bad(fmt::format("room {}: init() called twice or after abort", room));
  if (kv.empty()) return bad("a room needs at least one page");
  if (num_tokens == 0) num_tokens = kv.size() * layout_.page_size;
  if (layout_.pages_for(num_tokens) != kv.size())
    return bad(fmt::format("{} tokens take {} pages of {} tokens, not {}", num_tokens, layout_.pages_for(num_tokens),
                           layout_.page_size, kv.size()));
  if (aux_slot < 0 || static_cast<uint64_t>(aux_slot) >= layout_.aux_slots)
    return bad(fmt::format("aux_index {} is out of range: the pool has {} aux slots", aux_slot, layout_.aux_slots));
  std::vector<uint64_t> dst;
  std::set<uint64_t> seen;
  for (size_t i = 0; i < kv.size(); ++i) {
    if (kv[i] < 0 || static_cast<uint64_t>(kv[i]) >= layout_.num_pages)
      return bad(fmt::format("kv_indices[{}] = {} is out of range: the pool has {} pages", i, kv[i], layout_.num_pages));
    if (!seen.insert(static_cast<uint64_t>(kv[i])).second)
      return bad(fmt::format("kv_indices[{}] = {} appears twice", i, kv[i]));
    dst.push_back(static_cast<uint64_t>(kv[i]));
  }
  decode_->add_room(room, num_tokens);
  r.initialized = true;
  r.total_pages = kv.size();
  Status s = decode_->init(room, dst, static_cast<uint32_t>(aux_slot));
  core_->waker().signal();
  return s;
}

KVPoll Manager::poll_locked(uint64_t room, const Room& r) const {
  if (r.early_failure) return KVPoll::Failed;
  if (!r.initialized) return KVPoll::Bootstrapping;
  return prefill_ ? prefill_->poll(room) : decode_->poll(room);
}

KVPoll Manager::poll(uint64_t room) {
  std::lock_guard lock(mu_);
  auto it = rooms_.find(room);
  if (it == rooms_.end() || !core_) return KVPoll::Failed;
  return poll_locked(room, it->second);
}

std::optional<KVTransferError> Manager::failure_locked(uint64_t room, const Room& r) {
  if (r.early_failure) return r.early_failure;
  if (!r.initialized || poll_locked(room, r) != KVPoll::Failed) return std::nullopt;
  return core_->registry().get(room);
}

std::optional<KVTransferError> Manager::failure(uint64_t room) {
  std::lock_guard lock(mu_);
  auto it = rooms_.find(room);
  if (it == rooms_.end() || !core_) return std::nullopt;
  return failure_locked(room, it->second);
}

Status Manager::abort(uint64_t room, const std::string& reason) {
  std::lock_guard lock(mu_);
  auto it = rooms_.find(room);
  if (it == rooms_.end() || !core_) return bad(fmt::format("room {} is not open", room));
  Room& r = it->second;
  const int64_t now = monotonic_ns();
  if (!r.initialized) {
    if (!r.early_failure) {
      r.early_failure = KVTransferError{room, ErrorCode::kAborted, reason, self_, false, now};
      log_failure_locked(room, *r.early_failure);
      r.logged = true;
    }
    return Status::Ok();
  }
  if (prefill_) prefill_->fail(room, ErrorCode::kAborted, reason, self_, now, true);
  else decode_->fail(room, ErrorCode::kAborted, reason, self_, now, true);
  // Logged before abort() returns (the first cause wins: an earlier failure is the one logged).
  if (!r.logged && poll_locked(room, r) == KVPoll::Failed) {
    if (auto e = core_->registry().get(room)) log_failure_locked(room, *e);
    r.logged = true;
  }
  core_->waker().signal();
  return Status::Ok();
}

void Manager::close_room(uint64_t room) {
  std::lock_guard lock(mu_);
  auto it = rooms_.find(room);
  if (it != rooms_.end()) it->second.closing = true;
  if (core_) core_->waker().signal();
}

void Manager::inject_write_failure(uint64_t room, ErrorCode code, const std::string& reason) {
  std::lock_guard lock(mu_);
  if (core_) core_->faults().fail_room(room, code, reason);
}

Result<AuxRecord> Manager::aux(int64_t slot) {
  std::lock_guard lock(mu_);
  if (!core_) return bad("the manager is closed");
  if (slot < 0 || static_cast<uint64_t>(slot) >= layout_.aux_slots)
    return bad(fmt::format("aux slot {} is out of range ({} slots)", slot, layout_.aux_slots));
  AuxRecord rec;
  std::memcpy(&rec, config_.pool + layout_.aux_offset(static_cast<uint32_t>(slot)), sizeof rec);
  return rec;
}

size_t Manager::live_rooms() {
  std::lock_guard lock(mu_);
  return rooms_.size();
}

size_t Manager::peers() {
  std::lock_guard lock(mu_);
  if (!core_) return 0;
  return prefill_ ? prefill_->peers() : decode_->peers();
}

}  // namespace kvferry::python
