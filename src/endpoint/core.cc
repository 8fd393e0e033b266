#include "endpoint/core.h"

#include <utility>

namespace kvferry {

EndpointCore::EndpointCore(const EndpointConfig& c) : config_(c), registry_(c.self) {}

EndpointCore::~EndpointCore() {
  monitor_.reset();
  faults_.reset();
}

Result<std::unique_ptr<EndpointCore>> EndpointCore::create(const EndpointConfig& config) {
  std::unique_ptr<EndpointCore> core(new EndpointCore(config));
  TransportOptions topt;
  topt.shards = config.transfer_shards;
  auto t = make_transport(config.transport, topt);
  if (!t.ok()) return t.status();
  core->faults_ = std::make_unique<FaultInjectingTransport>(std::move(t).value());
  if (config.external_base != nullptr && config.external_bytes < config.layout.total_bytes())
    return Status(ErrorCode::kInvalidArgument,
                  "pool of " + std::to_string(config.external_bytes) + " bytes is smaller than its layout (" +
                      std::to_string(config.layout.total_bytes()) + " bytes)");
  if (config.external_base != nullptr) {  // one span at offset 0 of the offset space
    auto spans = core->faults_->register_spans({{config.external_base, config.external_bytes, 0}});
    if (!spans.ok()) return spans.status();
    core->region_ = spans->front();
  } else {
    auto region = core->faults_->create_region(config.layout.total_bytes());
    if (!region.ok()) return region.status();
    core->region_ = *region;
  }
  auto sock = ControlSocket::bind(config.control_bind);
  if (!sock.ok()) return sock.status();
  core->control_ = std::move(sock).value();
  EndpointCore* raw = core.get();
  core->faults_->set_peer_error_handler([raw](PeerId peer, Status st) {
    {
      std::lock_guard<std::mutex> lock(raw->mu_);
      raw->peer_errors_.push_back({peer, std::move(st)});
    }
    raw->waker_.signal();
  });
  core->monitor_ = std::make_unique<PeerMonitor>(config.self, config.deadlines);
  return core;
}

Status EndpointCore::send(const std::string& endpoint, const Message& m) {
  return control_->send(endpoint, encode(m));
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

}  // namespace kvferry
