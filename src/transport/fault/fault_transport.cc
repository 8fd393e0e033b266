// FaultInjectingTransport: injected failures, holds and delays (kvferry/fault_transport.h).
#include "kvferry/fault_transport.h"

#include <optional>

namespace kvferry {

FaultInjectingTransport::FaultInjectingTransport(std::unique_ptr<Transport> inner)
    : inner_(std::move(inner)), worker_([this] { run(); }) {}

FaultInjectingTransport::~FaultInjectingTransport() {
  release_connects();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [room, q] : queued_) {
      for (Queued& w : q.writes) {
        if (w.done) {
          completions_.emplace_back(std::move(w.done),
                                    Status(ErrorCode::kTransferError,
                                           "room " + std::to_string(room) +
                                               ": transport shut down with the write held"));
        }
      }
      q.writes.clear();
    }
  }
  cv_.notify_all();
  worker_.join();
}

bool FaultInjectingTransport::take_ready(uint64_t* room, Queued* out, Clock::time_point* next) {
  const auto now = Clock::now();
  *next = Clock::time_point::max();
  for (auto& [r, q] : queued_) {
    if (q.writes.empty() || held_.count(r) != 0) continue;
    if (q.writes.front().due <= now) {
      *room = r;
      *out = std::move(q.writes.front());
      q.writes.pop_front();
      q.forwarding++;
      return true;
    }
    if (q.writes.front().due < *next) *next = q.writes.front().due;
  }
  return false;
}

void FaultInjectingTransport::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!completions_.empty()) {
      auto [done, status] = std::move(completions_.front());
      completions_.pop_front();
      lock.unlock();
      try {
        done(std::move(status));
      } catch (...) {  // a throwing callback must not take the thread down
      }
      lock.lock();
      continue;
    }
    if (stopping_) return;  // completions drained; queued writes were turned into completions
    uint64_t room = 0;
    Queued w;
    Clock::time_point next;
    if (take_ready(&room, &w, &next)) {
      lock.unlock();
      forwarded_late_++;  // before: the wrapped transport may complete the write inside write()
      inner_->write(w.peer, room, std::move(w.ops), std::move(w.done));
      lock.lock();
      auto it = queued_.find(room);
      if (it != queued_.end() && --it->second.forwarding == 0 && it->second.writes.empty()) {
        queued_.erase(it);
      }
      continue;
    }
    if (next == Clock::time_point::max()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, next);
    }
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

void FaultInjectingTransport::hold_room(uint64_t room) {
  std::lock_guard<std::mutex> lock(mu_);
  held_.insert(room);
}

void FaultInjectingTransport::release_held(uint64_t room) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(room);
  }
  cv_.notify_all();
}

void FaultInjectingTransport::delay_room(uint64_t room, std::chrono::milliseconds delay) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (delay.count() > 0) {
      delays_.insert_or_assign(room, delay);
    } else {
      delays_.erase(room);
    }
  }
  cv_.notify_all();
}

size_t FaultInjectingTransport::queued_writes(uint64_t room) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queued_.find(room);
  return it == queued_.end() ? 0 : it->second.writes.size();
}

Result<LocalRegion> FaultInjectingTransport::create_region(uint64_t bytes) {
  auto r = inner_->create_region(bytes);
  if (r.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    local_regions_.push_back(*r);
  }
  return r;
}

Result<std::vector<LocalRegion>> FaultInjectingTransport::register_spans(
    const std::vector<MemorySpan>& spans) {
  auto r = inner_->register_spans(spans);
  if (r.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < r->size() && i < spans.size(); ++i)
      if (spans[i].memory == MemoryKind::kHost) local_regions_.push_back((*r)[i]);  // device bytes: not ours to flip
  }
  return r;
}

void FaultInjectingTransport::corrupt_next_write(uint64_t room, size_t skip) {
  std::lock_guard<std::mutex> lock(mu_);
  corrupt_[room] = skip;
}

uint8_t* FaultInjectingTransport::flip_first_byte(const std::vector<WriteOp>& ops) {
  for (const WriteOp& op : ops) {
    if (op.length == 0) continue;
    for (const LocalRegion& reg : local_regions_) {
      if (op.local_offset >= reg.offset && op.local_offset - reg.offset < reg.bytes && reg.base != nullptr)
        return reg.base + (op.local_offset - reg.offset);
    }
    return nullptr;
  }
  return nullptr;
}

TransportCaps FaultInjectingTransport::caps() const { return inner_->caps(); }

std::string FaultInjectingTransport::address() const { return inner_->address(); }

void FaultInjectingTransport::hold_connects() {
  std::lock_guard<std::mutex> lock(mu_);
  connects_held_ = true;
}

void FaultInjectingTransport::release_connects() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    connects_held_ = false;
  }
  connect_cv_.notify_all();
}

size_t FaultInjectingTransport::held_connects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connects_waiting_;
}

Status FaultInjectingTransport::connect_reverse(const std::string& peer_address) {
  return inner_->connect_reverse(peer_address);
}

Result<PeerId> FaultInjectingTransport::connect(const RemoteRegionInfo& peer) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    ++connects_waiting_;
    connect_cv_.wait(lock, [&] { return !connects_held_ || stopping_; });
    --connects_waiting_;
  }
  return inner_->connect(peer);
}

void FaultInjectingTransport::disconnect(PeerId peer) { inner_->disconnect(peer); }

void FaultInjectingTransport::write(PeerId peer, uint64_t room, std::vector<WriteOp> ops,
                                    std::function<void(Status)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto c = corrupt_.find(room); c != corrupt_.end() && !rooms_.count(room) && next_failures_ == 0 &&
                                      !stopping_) {
      uint8_t* byte = flip_first_byte(ops);
      if (byte != nullptr && c->second > 0) {
        --c->second;  // a batch let by
      } else if (byte != nullptr) {
        // The source byte is wrong while the batch is in flight (the copy that lands at the peer
        // carries it) and right again before the caller hears of the completion.
        corrupt_.erase(c);
        const uint8_t original = *byte;
        *byte = static_cast<uint8_t>(original ^ 0xff);
        corrupted_++;
        done = [byte, original, inner_done = std::move(done)](Status st) {
          *byte = original;
          if (inner_done) inner_done(std::move(st));
        };
      }
    }
    std::optional<Status> fault;
    auto it = rooms_.find(room);
    if (it != rooms_.end()) {
      fault = it->second;
    } else if (next_failures_ > 0) {
      --next_failures_;
      fault = Status(next_code_, "injected fault (fail_next_writes)");
    }
    if (fault || stopping_) {
      if (fault) injected_++;
      if (done) {
        completions_.emplace_back(
            std::move(done), fault ? std::move(*fault)
                                   : Status(ErrorCode::kTransferError, "transport shut down"));
      }
      cv_.notify_all();
      return;
    }
    auto delay = delays_.find(room);
    if (held_.count(room) != 0 || delay != delays_.end() || queued_.count(room) != 0) {
      Queued w{peer, std::move(ops), std::move(done), Clock::now()};
      if (delay != delays_.end()) w.due += delay->second;
      queued_[room].writes.push_back(std::move(w));
      cv_.notify_all();
      return;
    }
  }
  inner_->write(peer, room, std::move(ops), std::move(done));
}

void FaultInjectingTransport::set_peer_error_handler(
    std::function<void(PeerId, Status)> handler) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    peer_error_handler_ = handler;
  }
  inner_->set_peer_error_handler(std::move(handler));
}

void FaultInjectingTransport::set_write_fence(std::shared_ptr<WriteFence> fence) {
  inner_->set_write_fence(std::move(fence));
}

void FaultInjectingTransport::report_peer_error(PeerId peer, Status status) {
  std::function<void(PeerId, Status)> handler;
  {
    std::lock_guard<std::mutex> lk(mu_);
    handler = peer_error_handler_;
  }
  if (handler) handler(peer, std::move(status));
}

TransportStats FaultInjectingTransport::stats() const {
  TransportStats s = inner_->stats();
  uint64_t injected = injected_.load();
  s.batches += injected;
  s.failed_batches += injected;
  return s;
}

}  // namespace kvferry
