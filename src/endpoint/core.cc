#include "endpoint/core.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <utility>

#include "kvferry/log.h"

#include "endpoint/peer_monitor.h"
#include "endpoint/refusals.h"
#include "endpoint/span_compat.h"
#include "device/device_buffers.h"
#include "kvferry/port_file.h"

namespace kvferry {

uint64_t next_incarnation() {
  static std::atomic<uint64_t> last{0};
  const uint64_t now = static_cast<uint64_t>(std::max<int64_t>(1, realtime_ns()));
  uint64_t prev = last.load();
  uint64_t next = 0;
  do {
    next = std::max(now, prev + 1);
  } while (!last.compare_exchange_weak(prev, next));
  return next;
}

EndpointCore::EndpointCore(const EndpointConfig& c)
    : config_(c), incarnation_(c.incarnation != 0 ? c.incarnation : next_incarnation()), registry_(c.self) {}

void EndpointCore::refuse_stale(std::string_view kind, const RankId& sender, const std::string& why) {
  if (kind == "PoolRegistration" || kind == "RegistrationRefusal") ++incarnations_.stale_registrations;
  else if (kind == "RoomMetadata") ++incarnations_.stale_metadata;
  else if (kind == "RoomStatus") ++incarnations_.stale_statuses;
  else ++incarnations_.stale_heartbeats;
  peer_debug("endpoint", fmt::format("refused a {} from {}: {}", kind, sender.str(), why),
             {.extra = {{"event", "stale_refused"}, {"kind", std::string(kind)}, {"peer", sender.str()}}});
}

void EndpointCore::peer_debug(std::string_view component, std::string what, LogFields fields) {
  if (!peer_debug_lines_.take(monotonic_ns())) {
    ++peer_debug_dropped_;
    return;
  }
  if (peer_debug_dropped_ != 0) {
    what += fmt::format(" ({} earlier debug lines about peers' frames not written: rate limit)", peer_debug_dropped_);
    peer_debug_dropped_ = 0;
  }
  log_event(LogLevel::kDebug, component, what, std::move(fields));
}

EndpointCore::~EndpointCore() {
  if (faults_) faults_->release_connects();  // a connect a test holds must end for the join
  connector_.reset();
  monitor_.reset();
  faults_ = nullptr;
  transport_.reset();
}

Result<std::unique_ptr<EndpointCore>> EndpointCore::create(const EndpointConfig& config) {
  std::unique_ptr<EndpointCore> core(new EndpointCore(config));
  TransportOptions topt;
  topt.shards = config.transfer_shards;
  topt.tcp_congestion = config.tcp_congestion;
  auto t = make_transport(config.transport, topt);
  if (!t.ok()) return t.status();
  if (config.fault_injection) {
    auto f = std::make_unique<FaultInjectingTransport>(std::move(t).value());
    core->faults_ = f.get();
    core->transport_ = std::move(f);
  } else {
    core->transport_ = std::move(t).value();
  }
  Status mapped = core->build_map();
  if (!mapped.ok()) return mapped;
  auto spans = register_map(*core->transport_, core->map_);
  if (!spans.ok()) return spans.status();
  core->spans_ = std::move(spans).value();
  // Frames this rank can use: a RoomMetadata names at most every page of the pool (a room's pages
  // are this pool's pages on either side: page_size is the same, check_registration()).
  ControlLimits limits;
  limits.max_frame_bytes = ControlLimits::frame_bytes_for_pages(core->config_.layout.num_pages);
  auto sock = ControlSocket::bind(config.control, limits);
  if (!sock.ok()) return sock.status();
  core->control_ = std::move(sock).value();
  core->control_endpoint_ = core->control_->endpoint();  // the advertised endpoint (kvferry/net.h)
  EndpointCore* raw = core.get();
  core->transport_->set_peer_error_handler([raw](PeerId peer, Status st) {
    {
      std::lock_guard<std::mutex> lock(raw->mu_);
      raw->peer_errors_.push_back({peer, std::move(st)});
    }
    raw->waker_.signal();
  });
  core->monitor_ = std::make_unique<PeerMonitor>(config.self, config.deadlines, config.control, core->incarnation_);
  core->connector_ = std::make_unique<Connector>(*core->transport_, core->waker_);
  return core;
}

Status EndpointCore::build_map() {
  PoolLayout& l = config_.layout;
  if (config_.buffers.empty()) {
    if (config_.external_base != nullptr && config_.external_bytes < l.total_bytes())
      return Status(ErrorCode::kInvalidArgument,
                    "pool of " + std::to_string(config_.external_bytes) + " bytes is smaller than its layout (" +
                        std::to_string(l.total_bytes()) + " bytes)");
    map_ = MemoryMap::contiguous(l, config_.external_base);
    contiguous_ = true;
    return Status::Ok();
  }
  auto set = check_buffers(config_.buffers);
  if (!set.ok()) return set.status();
  // Device buffers: the device exists and the memory is its (docs/gpu.md), before any transport.
  if (Status s = device::check_device_buffers(config_.buffers, config_.device_copy.get()); !s.ok()) return s;
  if (set->kv.size() != l.num_buffers())
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} kv buffers for a model with {} (layers x tensors per layer)", set->kv.size(),
                              l.num_buffers()));
  if (set->page_bytes != l.page_bytes())
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("kv item_bytes {} is not a page of this rank's heads ({} tokens x {} heads x {} "
                              "bytes = {})",
                              set->page_bytes, l.page_size, l.heads_per_rank,
                              uint64_t(l.model.head_dim) * l.model.dtype_bytes, l.page_bytes()));
  const uint64_t rows = set->aux.empty() ? l.aux_slots : set->aux_rows;
  if (rows > UINT32_MAX) return Status(ErrorCode::kInvalidArgument, fmt::format("{} aux rows is too many", rows));
  auto map = MemoryMap::from_buffers(*set, l.page_size, rows, config_.guard_memory);
  if (!map.ok()) return map.status();
  map_ = std::move(map).value();
  contiguous_ = false;
  l.num_pages = set->num_pages;
  l.aux_slots = static_cast<uint32_t>(rows);
  return Status::Ok();
}

Status EndpointCore::send(const std::string& endpoint, const Message& m) {
  if (send_filter_ && !send_filter_(endpoint, m)) return Status::Ok();  // lost on the way (tests)
  if (send_refusal_ && send_refusal_(endpoint, m))  // the peer's queue is full (tests)
    return {ErrorCode::kResourceExhausted, "control socket: " + endpoint + " is not connected or its queue is full"};
  const bool unstamped = std::visit([](const auto& msg) { return msg.incarnation == 0; }, m);
  if (!unstamped) return control_->send(endpoint, encode(m));
  Message stamped = m;
  std::visit([this](auto& msg) { msg.incarnation = incarnation_; }, stamped);
  return control_->send(endpoint, encode(stamped));
}

void EndpointCore::post(TransportEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  waker_.signal();
}

std::vector<PeerError> EndpointCore::take_peer_errors() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PeerError> out;
  out.swap(peer_errors_);
  return out;
}

std::vector<TransportEvent> EndpointCore::take_events() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TransportEvent> out;
  out.swap(events_);
  return out;
}

uint64_t challenge_nonce() {
  std::random_device rd;  // the system's random source (getrandom on Linux)
  for (;;) {
    const uint64_t n = (uint64_t(rd()) << 32) ^ rd();
    if (n != 0) return n;
  }
}

bool old_endpoint_gone(const std::string& endpoint, int64_t silent_ns, RateLimit& probes, int64_t now_ns) {
  if (!endpoint.starts_with("tcp://") || !probes.take(now_ns)) return false;
  const PeerMonitor::Probe p = PeerMonitor::probe(endpoint, 20);
  return p == PeerMonitor::Probe::kRefused ||
         (p == PeerMonitor::Probe::kUnanswered && silent_ns >= kHostGoneSilenceNs);
}

void PeerChallenges::send(EndpointCore& core, const RankId& peer, const std::string& endpoint, int64_t now_ns) {
  Out& o = out_[peer];
  if (o.nonce != 0 && now_ns - o.sent_ns < core.config().deadlines.heartbeat_interval_ms * 1'000'000) return;
  if (o.nonce == 0) o.nonce = challenge_nonce();
  o.sent_ns = now_ns;
  Heartbeat challenge{core.self(), 0, now_ns, core.incarnation()};
  challenge.challenge = o.nonce;
  (void)core.send(endpoint, challenge);
}

bool PeerChallenges::answered(const Heartbeat& hb) {
  auto it = out_.find(hb.sender);
  if (it == out_.end() || it->second.nonce != hb.answer) return false;
  out_.erase(it);
  return true;
}

void challenge_unproven(EndpointCore& core, PeerMonitor& monitor, PeerChallenges& c, int64_t now_ns,
                        const std::function<const std::string*(const RankId&)>& endpoint_of) {
  for (const RankId& peer : monitor.take_unproven())
    if (const std::string* endpoint = endpoint_of(peer)) c.send(core, peer, *endpoint, now_ns);
}

bool proven_alive(EndpointCore& /*core*/, PeerMonitor& monitor, PeerChallenges& c, const Heartbeat& hb, uint64_t known) {
  if (!c.answered(hb)) return false;
  if (hb.incarnation == known) {
    log_event(LogLevel::kDebug, "endpoint", fmt::format("{} answered a challenge at its endpoint: alive", hb.sender.str()));
    monitor.heard(hb.sender, monotonic_ns(), /*proven=*/true);
  }
  return true;
}

}  // namespace kvferry
