// UcxTransport: lifecycle, the progress thread, the region, peers (connect/disconnect/errors).
// The write path and the active-message handlers are in ucx_write.cc.
#include "transport/ucx/ucx_transport.h"

#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>

#include "transport/ucx/ucx_config.h"

namespace kvferry::ucx {

WriteMode UcxTransport::mode_for(const TransportOptions& options, const UcxTestHooks& hooks) {
  return options.kind == TransportKind::kShm || hooks.force_put ? WriteMode::kPut
                                                                : WriteMode::kActiveMessage;
}

UcxTransport::UcxTransport(const TransportOptions& options, const UcxTestHooks& hooks,
                           ucp_context_h shared_context)
    : options_(options),
      hooks_(hooks),
      mode_(mode_for(options, hooks)),
      owns_context_(shared_context == nullptr),
      context_(shared_context) {}

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(const TransportOptions& options,
                                                           const UcxTestHooks& hooks,
                                                           ucp_context_h shared_context) {
  try {
    std::unique_ptr<UcxTransport> t(new UcxTransport(options, hooks, shared_context));
    Status st = t->start();
    if (!st.ok()) return st;
    return t;
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInternal, std::string("ucx transport: ") + e.what());
  }
}

Status UcxTransport::start() {
  if (!commands_.valid()) return {ErrorCode::kInternal, "ucx transport: eventfd failed"};
  std::promise<Status> started;
  auto result = started.get_future();
  thread_ = std::thread([this, &started] {
    run([&started](Status st) { started.set_value(std::move(st)); });
  });
  return result.get();
}

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    post([this] { stop_ = true; });
    thread_.join();
  }
}

bool UcxTransport::post(std::function<void()> fn) { return commands_.post(std::move(fn)); }

bool UcxTransport::on_progress_thread() const {
  return std::this_thread::get_id() == thread_id_.load();
}

template <typename T>
Result<T> UcxTransport::call(std::function<Result<T>()> fn) {
  if (on_progress_thread()) {
    return Result<T>(ErrorCode::kInternal, "transport called from its own completion callback");
  }
  auto answer = std::make_shared<std::promise<Result<T>>>();
  auto result = answer->get_future();
  bool posted = post([this, answer, fn = std::move(fn)] {
    if (shutting_down_) {
      answer->set_value(Result<T>(ErrorCode::kInternal, "transport is shutting down"));
      return;
    }
    try {
      answer->set_value(fn());
    } catch (const std::exception& e) {
      answer->set_value(Result<T>(ErrorCode::kInternal, e.what()));
    }
  });
  if (!posted) return Result<T>(ErrorCode::kInternal, "transport is shut down");
  return result.get();
}

void UcxTransport::run(std::function<void(Status)> started) {
  thread_id_ = std::this_thread::get_id();
  // Bulk copies (shm puts, TCP receive copies) yield to the latency-critical threads of every rank.
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 5);
  Status st = init_ucx();
  if (!st.ok()) {
    teardown();
    started(st);
    return;
  }
  started(Status::Ok());
  pollfd fds[2] = {{commands_.fd(), POLLIN, 0}, {worker_efd_, POLLIN, 0}};
  while (!stop_) {
    commands_.run_pending();
    if (stop_) break;
    if (!connects_.empty()) check_connect_deadlines();
    if (ucp_worker_progress(worker_) != 0) continue;
    if (!commands_.empty()) continue;
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;  // events arrived meanwhile
    ::poll(fds, 2, kIdleWakeMs);  // idle: sleep until a command, a UCX event or the keepalive tick
  }
  teardown();
}

Result<ucp_context_h> UcxTransport::create_context(const TransportOptions& options,
                                                   const UcxTestHooks& hooks,
                                                   bool shared_workers) {
  if (options.kind == TransportKind::kShm) enable_shm_error_handling_env();
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return ucx_error(ErrorCode::kInternal, "ucp_config_read", s);
  std::string tls =
      options.ucx_tls_override.empty() ? default_tls(options.kind) : options.ucx_tls_override;
  s = ucp_config_modify(config, "TLS", tls.c_str());
  if (s == UCS_OK && std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    s = ucp_config_modify(config, "KEEPALIVE_INTERVAL", kDefaultKeepaliveInterval);
  }
  if (s != UCS_OK) {
    ucp_config_release(config);
    return ucx_error(ErrorCode::kInternal, "ucp_config_modify", s);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_WAKEUP |
                    (mode_for(options, hooks) == WriteMode::kPut ? UCP_FEATURE_RMA
                                                                 : UCP_FEATURE_AM);
  if (shared_workers) {
    params.field_mask |= UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.mt_workers_shared = 1;
  }
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) return ucx_error(ErrorCode::kInternal, "ucp_init (UCX_TLS=" + tls + ")", s);
  return context;
}

Status UcxTransport::init_ucx() {
  if (owns_context_) {
    auto context = create_context(options_, hooks_, /*shared_workers=*/false);
    if (!context.ok()) return context.status();
    context_ = context.value();
  }
  ucs_status_t s = UCS_OK;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches the worker
  s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) return ucx_error(ErrorCode::kInternal, "ucp_worker_create", s);
  s = ucp_worker_get_efd(worker_, &worker_efd_);
  if (s != UCS_OK) return ucx_error(ErrorCode::kInternal, "ucp_worker_get_efd", s);

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  s = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (s != UCS_OK) return ucx_error(ErrorCode::kInternal, "ucp_worker_get_address", s);
  address_.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker_, addr);
  return mode_ == WriteMode::kActiveMessage ? register_am_handlers() : Status::Ok();
}

void UcxTransport::teardown() {
  shutting_down_ = true;
  commands_.close();
  commands_.run_pending();  // late commands see shutting_down_ and fail fast
  std::vector<Batch*> open;
  for (auto& [id, b] : batches_) {
    if (!b->finished) open.push_back(b.get());
  }
  for (Batch* b : open) finish(*b, {ErrorCode::kTransferError, "transport shut down"});
  for (ConnectCtx* c : connects_) complete_connect(*c, {ErrorCode::kInternal, "shut down"});
  for (auto& [id, p] : peers_) {
    p->erase_when_closed = false;
    if (p->ep != nullptr && !p->closing) close_peer(*p, /*force=*/true);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  auto any_open = [this] {
    for (auto& [id, p] : peers_) {
      if (p->ep != nullptr) return true;
    }
    return false;
  };
  while (worker_ != nullptr && any_open() && std::chrono::steady_clock::now() < deadline) {
    ucp_worker_progress(worker_);
  }
  for (auto& [id, p] : peers_) {
    if (p->rkey != nullptr) ucp_rkey_destroy(p->rkey);
    p->rkey = nullptr;
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);  // may still run request callbacks
  worker_ = nullptr;
  if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);  // no receive can target it any more
  memh_ = nullptr;
  if (plain_mmap_ != nullptr) munmap(plain_mmap_, region_bytes_);
  plain_mmap_ = nullptr;
  peers_.clear();
  batches_.clear();
  for (RecvCtx* r : recvs_) delete r;
  recvs_.clear();
  for (AckMsg* a : acks_in_flight_) delete a;
  acks_in_flight_.clear();
  for (ConnectCtx* c : connects_) delete c;
  connects_.clear();
  if (context_ != nullptr && owns_context_) ucp_cleanup(context_);
  context_ = nullptr;
  live_peers_ = 0;
}

Result<LocalRegion> UcxTransport::create_region(uint64_t bytes) {
  return call<LocalRegion>([this, bytes] { return do_create_region(bytes); });
}

Result<LocalRegion> UcxTransport::register_region(uint8_t* base, uint64_t bytes) {
  if (base == nullptr) return Result<LocalRegion>(ErrorCode::kInvalidArgument, "register_region: null base");
  return call<LocalRegion>([this, base, bytes] { return do_create_region(bytes, base); });
}

Status UcxTransport::share_region(uint8_t* base, uint64_t bytes) {
  auto r = call<bool>([this, base, bytes]() -> Result<bool> {
    if (base == nullptr || bytes == 0) {
      return Result<bool>(ErrorCode::kInvalidArgument, "share_region: null or empty");
    }
    if (region_base_ != nullptr) {
      return Result<bool>(ErrorCode::kInvalidArgument, "share_region: a region exists");
    }
    region_base_ = base;
    region_bytes_ = bytes;
    return true;
  });
  return r.ok() ? Status::Ok() : r.status();
}

Result<LocalRegion> UcxTransport::do_create_region(uint64_t bytes, uint8_t* user) {
  if (region_base_ != nullptr) {
    return Result<LocalRegion>(ErrorCode::kInvalidArgument, "create_region: already created");
  }
  if (bytes == 0) return Result<LocalRegion>(ErrorCode::kInvalidArgument, "create_region: 0 bytes");
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.length = bytes;
  if (user != nullptr) {
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
    mp.address = user;
  } else if (hooks_.plain_mmap_region) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return Result<LocalRegion>(ErrorCode::kResourceExhausted,
                                 "mmap of " + std::to_string(bytes) + " bytes failed");
    }
    plain_mmap_ = p;
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
    mp.address = p;
  } else {
    // UCX allocates (posix/sysv shared memory for shm, so a peer's put is a memcpy); pages are
    // only touched when written.
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
  }
  ucs_status_t s = ucp_mem_map(context_, &mp, &memh_);
  if (s != UCS_OK) {
    memh_ = nullptr;
    if (plain_mmap_ != nullptr) munmap(plain_mmap_, bytes);
    plain_mmap_ = nullptr;
    return ucx_error(ErrorCode::kResourceExhausted,
                     "ucp_mem_map of " + std::to_string(bytes) + " bytes", s);
  }
  region_bytes_ = bytes;
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  s = ucp_mem_query(memh_, &attr);
  void* rkey_buf = nullptr;
  size_t rkey_len = 0;
  if (s == UCS_OK) s = ucp_rkey_pack(context_, memh_, &rkey_buf, &rkey_len);
  if (s != UCS_OK) {
    ucp_mem_unmap(context_, memh_);
    memh_ = nullptr;
    if (plain_mmap_ != nullptr) munmap(plain_mmap_, bytes);
    plain_mmap_ = nullptr;
    region_bytes_ = 0;
    return ucx_error(ErrorCode::kInternal, "ucp_mem_query/ucp_rkey_pack", s);
  }
  // UCX reports the registration rounded out to whole pages; caller memory starts where it said.
  region_base_ = user != nullptr ? user : static_cast<uint8_t*>(attr.address);
  LocalRegion region;
  region.base = region_base_;
  region.bytes = bytes;
  region.packed_rkey.assign(static_cast<const char*>(rkey_buf), rkey_len);
  ucp_rkey_buffer_release(rkey_buf);
  return region;
}

TransportStats UcxTransport::stats() const {
  TransportStats s;
  s.bytes_written = bytes_written_.load();
  s.writes = writes_.load();
  s.batches = batches_done_.load();
  s.failed_batches = failed_batches_.load();
  s.peers = live_peers_.load();
  return s;
}

std::string UcxTransport::describe_peer(PeerId id) {
  auto r = call<std::string>([this, id]() -> Result<std::string> {
    auto it = peers_.find(id);
    if (it == peers_.end() || it->second->ep == nullptr) return std::string();
    char* buf = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&buf, &len);
    if (f == nullptr) return std::string();
    ucp_ep_print_info(it->second->ep, f);
    std::fclose(f);
    std::string text(buf, len);
    std::free(buf);
    return text;
  });
  return r.ok() ? r.value() : std::string();
}

}  // namespace kvferry::ucx
