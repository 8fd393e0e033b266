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

#include "kvferry/log.h"
#include "transport/ucx/tcp_congestion.h"
#include "core/residency.h"
#include "transport/ucx/shm_mapping.h"
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
  std::string tls = tls_for(options);
  s = ucp_config_modify(config, "TLS", tls.c_str());
  if (s == UCS_OK && options.kind == TransportKind::kShm) {
    s = ucp_config_modify(config, "MM_SEG_SIZE", std::to_string(kShmSegSize).c_str());
  }
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
  Status st;
  if (owns_context_) {
    auto context = create_context(options_, hooks_, /*shared_workers=*/false);
    if (!context.ok()) return context.status();
    context_ = context.value();
  }
  tls_ = tls_for(options_);
  ucp_context_attr_t ca{};
  ca.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  ucs_status_t s = ucp_context_query(context_, &ca);
  if (s != UCS_OK) return ucx_error(ErrorCode::kInternal, "ucp_context_query", s);
  memory_types_ = ca.memory_types;
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
  st = learn_layout();
  if (!st.ok()) return st;
  tune_tcp_sockets({});  // the listeners: sockets UCX accepts inherit their algorithm
  return mode_ == WriteMode::kActiveMessage ? register_am_handlers() : Status::Ok();
}

Status UcxTransport::learn_layout() {
  layout_.memory_types = memory_types_ | UCS_BIT(UCS_MEMORY_TYPE_HOST);
  layout_.shm_only = options_.kind == TransportKind::kShm;
  Status st = layout_.learn_address(address_);
  if (!st.ok() || mode_ != WriteMode::kPut) return st;
  // Put mode: the size of each component's rkey as this UCX packs it, from a probe region of
  // one page allocated the way create_region allocates (docs/transport.md "What reaches UCX").
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.length = 4096;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  if (ucp_mem_map(context_, &mp, &memh) != UCS_OK) return Status::Ok();  // the facts of ucx_layout.cc stand
  void* buf = nullptr;
  size_t len = 0;
  if (ucp_rkey_pack(context_, memh, &buf, &len) == UCS_OK) {
    st = layout_.learn_rkey(std::string_view(static_cast<const char*>(buf), len));
    ucp_rkey_buffer_release(buf);
  }
  ucp_mem_unmap(context_, memh);
  return st;
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
  // Open: an endpoint not closed yet, an ack still in flight on a peer's reply endpoint, a
  // receive of a peer's rendezvous data, or a write's request not returned; each would make ucp_worker_destroy abort on an assertion
  // (UCX 1.13, `ucp_ep.c:437 ... proto_reqs` for the ack; docs/transport.md "Teardown").
  auto any_open = [this] {
    if (!acks_in_flight_.empty() || !recvs_.empty()) return true;
    for (auto& [id, p] : peers_) {
      if (p->ep != nullptr) return true;
    }
    for (auto& [id, b] : batches_) {
      if (b->requests != 0) return true;
    }
    return false;
  };
  while (worker_ != nullptr && any_open() && std::chrono::steady_clock::now() < deadline) {
    ucp_worker_progress(worker_);
  }
  for (auto& [id, p] : peers_) p->destroy_rkeys();
  // An endpoint close still pending here (a graceful close towards a peer that went silent)
  // would make ucp_worker_destroy abort on an assertion (UCX 1.13): the worker and the context
  // are left to the process's exit instead, and the line says so (docs/transport.md, "Teardown").
  bool abandon = worker_ != nullptr && any_open();
  if (abandon) {
    log_event(LogLevel::kDebug, "transport",
              "teardown: endpoint closes or sends still pending after 2 s; the UCX worker is left to exit");
  } else if (worker_ != nullptr) {
    ucp_worker_destroy(worker_);  // may still run request callbacks
  }
  worker_ = nullptr;
  unmap_all();  // no receive can target the spans any more
  peers_.clear();
  batches_.clear();
  for (RecvCtx* r : recvs_) delete r;
  recvs_.clear();
  for (AckMsg* a : acks_in_flight_) delete a;
  acks_in_flight_.clear();
  for (ConnectCtx* c : connects_) delete c;
  connects_.clear();
  if (context_ != nullptr && owns_context_ && !abandon) ucp_cleanup(context_);
  context_ = nullptr;
  live_peers_ = 0;
  reverse_peers_ = 0;
}

Result<LocalRegion> UcxTransport::create_region(uint64_t bytes) {
  return call<LocalRegion>([this, bytes] { return do_create_region(bytes); });
}

Result<std::vector<LocalRegion>> UcxTransport::register_spans(const std::vector<MemorySpan>& spans) {
  using R = Result<std::vector<LocalRegion>>;
  std::vector<size_t> order;
  Status st = check_spans(spans, kMaxTransportSpans, ErrorCode::kInvalidArgument,
                          "register_spans", &order);
  if (!st.ok()) return st;
  const TransportCaps c = caps();
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].base == nullptr) {
      return R(ErrorCode::kInvalidArgument, "register_spans: span " + std::to_string(i) + " has a null base");
    }
    if (!c.supports(spans[i].memory)) {
      return R(ErrorCode::kInvalidArgument,
               "register_spans: span " + std::to_string(i) + " is " +
                   std::string(memory_kind_name(spans[i].memory)) + " memory: " + c.cuda_missing);
    }
  }
  return call<std::vector<LocalRegion>>([this, spans] { return do_register_spans(spans); });
}

TransportCaps UcxTransport::caps() const {
  TransportCaps c;
  c.name = std::string(transport_name(options_.kind));
  c.memory_kinds = {MemoryKind::kHost};
  c.one_sided_put = mode_ == WriteMode::kPut;
  c.receiver_copy = true;  // tcp: every write; shm: writes into caller-owned spans
  const bool ucx_cuda = (memory_types_ & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  if (mode_ == WriteMode::kPut && ucx_cuda) {
    c.memory_kinds.push_back(MemoryKind::kCuda);
  } else if (mode_ != WriteMode::kPut) {
    c.cuda_missing =
        "the tcp transport copies on the receiver's CPU (active messages into host memory); device "
        "memory needs the shm transport on a UCX build with CUDA support (cuda_copy/cuda_ipc "
        "transports, UCX configured --with-cuda)";
  } else {
    c.cuda_missing = "UCX reports no CUDA memory support for UCX_TLS=" + tls_ +
                     ": device memory needs a UCX build with CUDA support (cuda_copy/cuda_ipc "
                     "transports, UCX configured --with-cuda) and those transports in UCX_TLS "
                     "(TransportOptions::ucx_tls_override)";
  }
  return c;
}

Status UcxTransport::share_spans(std::vector<LocalSpanView> spans) {
  auto r = call<bool>([this, spans = std::move(spans)]() mutable -> Result<bool> {
    if (spans.empty()) return Result<bool>(ErrorCode::kInvalidArgument, "share_spans: no spans");
    if (!spans_.empty()) {
      return Result<bool>(ErrorCode::kInvalidArgument, "share_spans: memory is registered already");
    }
    spans_ = SpanTable(std::move(spans));
    return true;
  });
  return r.ok() ? Status::Ok() : r.status();
}

Result<LocalRegion> UcxTransport::map_span(void* address, uint64_t bytes, MemoryKind memory) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.length = bytes;
  if (address != nullptr) {
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
    mp.address = address;
  } else {
    // UCX allocates (posix/sysv shared memory for shm, so a peer's put is a memcpy); pages are
    // only touched when written.
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
  }
  if (memory == MemoryKind::kCuda) {
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
  if (s != UCS_OK) {
    return ucx_error(ErrorCode::kResourceExhausted,
                     "ucp_mem_map of " + std::to_string(bytes) + " bytes", s);
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  s = ucp_mem_query(memh, &attr);
  void* rkey_buf = nullptr;
  size_t rkey_len = 0;
  if (s == UCS_OK) s = ucp_rkey_pack(context_, memh, &rkey_buf, &rkey_len);
  if (s != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    return ucx_error(ErrorCode::kInternal, "ucp_mem_query/ucp_rkey_pack", s);
  }
  memhs_.push_back(memh);
  LocalRegion region;
  // UCX reports a registration rounded out to whole pages; caller memory starts where it said.
  region.base = address != nullptr ? static_cast<uint8_t*>(address) : static_cast<uint8_t*>(attr.address);
  region.bytes = bytes;
  if (memory == MemoryKind::kHost) keep_resident(region.base, bytes, "registered span", true);
  region.packed_rkey.assign(static_cast<const char*>(rkey_buf), rkey_len);
  ucp_rkey_buffer_release(rkey_buf);
  (void)layout_.learn_rkey(region.packed_rkey);  // a peer's rkey naming this segment is refused
  return region;
}

void UcxTransport::unmap_all() {
  for (ucp_mem_h m : memhs_) ucp_mem_unmap(context_, m);
  memhs_.clear();
  if (plain_mmap_ != nullptr) munmap(plain_mmap_, plain_mmap_bytes_);
  plain_mmap_ = nullptr;
  plain_mmap_bytes_ = 0;
}

Result<LocalRegion> UcxTransport::do_create_region(uint64_t bytes) {
  if (!spans_.empty()) {
    return Result<LocalRegion>(ErrorCode::kInvalidArgument, "create_region: memory is registered already");
  }
  if (bytes == 0) return Result<LocalRegion>(ErrorCode::kInvalidArgument, "create_region: 0 bytes");
  void* address = nullptr;
  if (hooks_.plain_mmap_region) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return Result<LocalRegion>(ErrorCode::kResourceExhausted,
                                 "mmap of " + std::to_string(bytes) + " bytes failed");
    }
    plain_mmap_ = address = p;
    plain_mmap_bytes_ = bytes;
  }
  auto region = map_span(address, bytes, MemoryKind::kHost);
  if (!region.ok()) {
    unmap_all();
    return region;
  }
  spans_ = SpanTable({{0, bytes, region->base}});
  return region;
}

Result<std::vector<LocalRegion>> UcxTransport::do_register_spans(const std::vector<MemorySpan>& spans) {
  using R = Result<std::vector<LocalRegion>>;
  if (!spans_.empty()) return R(ErrorCode::kInvalidArgument, "register_spans: memory is registered already");
  std::vector<LocalRegion> out;
  std::vector<LocalSpanView> views;
  out.reserve(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    auto r = map_span(spans[i].base, spans[i].bytes, spans[i].memory);
    if (!r.ok()) {
      unmap_all();
      return R(r.status().code(), "register_spans: span " + std::to_string(i) + ": " + r.status().message());
    }
    r->offset = spans[i].offset;
    views.push_back({spans[i].offset, spans[i].bytes, spans[i].base});
    out.push_back(std::move(r).value());
  }
  spans_ = SpanTable(std::move(views));
  return out;
}

TransportStats UcxTransport::stats() const {
  TransportStats s;
  s.bytes_written = bytes_written_.load();
  s.writes = writes_.load();
  s.batches = batches_done_.load();
  s.failed_batches = failed_batches_.load();
  s.peers = live_peers_.load();
  s.locked_bytes = locked_bytes_.load();
  s.unlocked_bytes = unlocked_bytes_.load();
  s.residency_warnings = residency_warnings_.load();
  s.tcp_sockets_tuned = tcp_sockets_tuned_.load();
  s.tcp_congestion_failures = tcp_congestion_failures_.load();
  s.reverse_peers = reverse_peers_.load();
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

void UcxTransport::keep_resident(void* base, uint64_t bytes, const std::string& what, bool own) {
  // docs/transport.md "Resident memory": locked and faulted in before any write may use it.
  Mapping m;
  const bool shared = find_mapping(reinterpret_cast<uintptr_t>(base), &m) && m.shared;
  const ResidencyResult r = make_resident(base, bytes, shared, residency_);
  if (own) (r.locked ? locked_bytes_ : unlocked_bytes_) += bytes;
  // A system policy, the same for every span: at debug, once per transport (docs/transport.md).
  if (!r.note.empty() && !residency_noted_.exchange(true)) log_event(LogLevel::kDebug, "transport", r.note);
  if (r.warning.empty()) return;
  // Counted every time; logged at warning once per transport (then at debug): the cause is the
  // same for every span (a limit or a system policy).
  residency_warnings_++;
  const bool first = !residency_warned_.exchange(true);
  log_event(first ? LogLevel::kWarning : LogLevel::kDebug, "transport",
            what + " of " + std::to_string(bytes) + " bytes: " + r.warning);
}

void UcxTransport::tune_tcp_sockets(std::string_view peer_address) {
  // docs/transport.md "TCP congestion control".
  if (options_.tcp_congestion.empty() || tls_.find("tcp") == std::string::npos) return;
  const CongestionOutcome r = set_ucx_congestion(options_.tcp_congestion, address_, peer_address);
  tcp_sockets_tuned_ += r.tuned;
  if (r.failed == 0) return;
  tcp_congestion_failures_ += r.failed;
  const bool first = !congestion_warned_.exchange(true);
  log_event(first ? LogLevel::kWarning : LogLevel::kDebug, "transport",
            r.error + ": the tcp lane keeps the host's congestion control (TransportOptions::tcp_congestion)");
}

}  // namespace kvferry::ucx
