#include "endpoint/peer_monitor.h"

#include <chrono>
#include <memory>

#include "kvferry/control.h"
#include "kvferry/messages.h"

namespace kvferry {

PeerMonitor::PeerMonitor(RankId self, const Deadlines& deadlines)
    : self_(self), deadlines_(deadlines), thread_([this] { run(); }) {}

PeerMonitor::~PeerMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PeerMonitor::watch(const RankId& peer, const std::string& control_endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_[peer] = {control_endpoint, monotonic_ns(), false};
}

void PeerMonitor::unwatch(const RankId& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_.erase(peer);
}

void PeerMonitor::heard(const RankId& peer, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  it->second.last_heard_ns = now_ns;
  if (it->second.reported) {
    it->second.reported = false;
    it->second.revived = true;
  }
}

void PeerMonitor::mark_dead(const RankId& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it != peers_.end()) it->second.reported = true;
}

std::vector<RankId> PeerMonitor::take_revived() {
  std::vector<RankId> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [rank, p] : peers_) {
    if (p.revived) {
      p.revived = false;
      out.push_back(rank);
    }
  }
  return out;
}

std::vector<DeadPeer> PeerMonitor::take_dead(int64_t now_ns) {
  std::vector<DeadPeer> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [rank, p] : peers_) {
    int64_t silent = now_ns - p.last_heard_ns;
    if (!p.reported && silent > deadlines_.heartbeat_timeout_ms * 1'000'000) {
      p.reported = true;
      out.push_back({rank, silent / 1'000'000});
    }
  }
  return out;
}

size_t PeerMonitor::watched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peers_.size();
}

void PeerMonitor::run() {
  auto sock = ControlSocket::bind("tcp://127.0.0.1:0");
  if (!sock.ok()) return;  // no heartbeats: peers will time us out, which is the honest outcome
  uint64_t seq = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    std::vector<std::string> endpoints;
    for (auto& [rank, p] : peers_) endpoints.push_back(p.endpoint);
    lock.unlock();
    Heartbeat hb{self_, ++seq, monotonic_ns()};
    std::string frame = encode(hb);
    for (const std::string& ep : endpoints) (void)(*sock)->send(ep, frame);
    (void)(*sock)->recv(std::chrono::milliseconds(0));  // lets held frames go out
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(deadlines_.heartbeat_interval_ms), [&] { return stop_; });
  }
}

}  // namespace kvferry
