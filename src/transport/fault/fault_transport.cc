#include "kvferry/fault_transport.h"

#include <optional>

namespace kvferry {

FaultInjectingTransport::FaultInjectingTransport(std::unique_ptr<Transport> inner)
    : inner_(std::move(inner)), completer_([this] { run_completions(); }) {}

FaultInjectingTransport::~FaultInjectingTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  completer_.join();
}

void FaultInjectingTransport::run_completions() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !completions_.empty(); });
    if (completions_.empty()) return;  // stopping and drained
    auto [done, status] = std::move(completions_.front());
    completions_.pop_front();
    lock.unlock();
    try {
      done(std::move(status));
    } catch (...) {  // a throwing callback must not take the thread down
    }
    lock.lock();
  }
}

void FaultInjectingTransport::fail_room(uint64_t room, ErrorCode code, std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  rooms_.insert_or_assign(room, Status(code, std::move(reason)));
}

void FaultInjectingTransport::clear_room(uint64_t room) {
  std::lock_guard<std::mutex> lock(mu_);
  rooms_.erase(room);
}

void FaultInjectingTransport::fail_next_writes(size_t n, ErrorCode code) {
  std::lock_guard<std::mutex> lock(mu_);
  next_failures_ = n;
  next_code_ = code;
}

Result<LocalRegion> FaultInjectingTransport::create_region(uint64_t bytes) {
  return inner_->create_region(bytes);
}

Result<LocalRegion> FaultInjectingTransport::register_region(uint8_t* base, uint64_t bytes) {
  return inner_->register_region(base, bytes);
}

std::string FaultInjectingTransport::address() const { return inner_->address(); }

Result<PeerId> FaultInjectingTransport::connect(const RemoteRegionInfo& peer) {
  return inner_->connect(peer);
}

void FaultInjectingTransport::disconnect(PeerId peer) { inner_->disconnect(peer); }

void FaultInjectingTransport::write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
                                    std::function<void(Status)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<Status> fault;
    auto it = rooms_.find(room);
    if (it != rooms_.end()) {
      fault = it->second;
    } else if (next_failures_ > 0) {
      --next_failures_;
      fault = Status(next_code_, "injected fault (fail_next_writes)");
    }
    if (fault) {
      injected_++;
      if (done) completions_.emplace_back(std::move(done), std::move(*fault));
      cv_.notify_one();
      return;
    }
  }
  inner_->write(peer, room, std::move(ops), std::move(done));
}

void FaultInjectingTransport::set_peer_error_handler(
    std::function<void(PeerId, Status)> handler) {
  inner_->set_peer_error_handler(std::move(handler));
}

TransportStats FaultInjectingTransport::stats() const {
  TransportStats s = inner_->stats();
  uint64_t injected = injected_.load();
  s.batches += injected;
  s.failed_batches += injected;
  return s;
}

}  // namespace kvferry
