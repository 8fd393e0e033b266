// PeerMonitor: control-plane heartbeats between peer ranks of the two engines (docs/design.md §4 defect 8:
// detect a dead peer in well under a second, and never declare a busy one dead).
//
// A dedicated thread sends a Heartbeat to every watched peer's control endpoint each
// heartbeat_interval, through its own ZeroMQ socket, so a busy main loop never delays them. The
// main thread records every frame it receives from a peer (heard()); ZeroMQ queues frames while
// the main thread is busy, and they are drained before take_dead() is asked, so a busy receiver
// does not misjudge a live peer either. A peer silent for heartbeat_timeout is reported once by
// take_dead(), until it is heard from again (take_revived()) or watched again (e.g. after it
// restarted and re-registered); heartbeats keep going to a peer reported dead.
// A silence alone is only a suspicion: on a heavily loaded host a live peer's heartbeat thread
// (or ZeroMQ's I/O threads) may not run for a while. It is confirmed by a second signal that does
// not need the peer to be scheduled: a TCP connect to the peer's control endpoint, which the
// kernel answers for a live process and refuses at once for a killed one (its sockets closed with
// it). A suspect whose endpoint still accepts is not reported until it has been silent for
// kHungFactor x heartbeat_timeout (a hung process). So a kill -9 is still reported after
// heartbeat_timeout, a busy peer is not. Probes go at most every kProbeIntervalMs per peer.
// The probe resolves the endpoint's host (a host name, IPv4 or IPv6 literal: getaddrinfo) and tries
// each of its addresses within the probe's budget; any that accepts means alive. A host name is
// resolved at each probe (fast from /etc/hosts; a slow DNS resolver would delay take_dead()).
// The heartbeat socket binds `heartbeat` (kvferry/net.h; nothing is sent to it, its PUSH sockets
// reach peers on any address). Its port is always chosen by the system.
// Thread contract: watch/unwatch/heard/take_dead from the main thread; the sender thread is internal.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/deadlines.h"
#include "kvferry/error.h"
#include "kvferry/net.h"

namespace kvferry {

struct DeadPeer {
  RankId peer;
  int64_t silent_ms = 0;
};

class PeerMonitor {
 public:
  // `incarnation`: this rank's, carried by every heartbeat (kvferry/messages.h; 0: 1).
  PeerMonitor(RankId self, const Deadlines& deadlines, ListenAddress heartbeat = {}, uint64_t incarnation = 1);
  ~PeerMonitor();
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  void watch(const RankId& peer, const std::string& control_endpoint);
  void unwatch(const RankId& peer);
  void heard(const RankId& peer, int64_t now_ns);
  std::vector<DeadPeer> take_dead(int64_t now_ns);
  // Peers reported dead that were heard from again since (a transient silence, not a death).
  std::vector<RankId> take_revived();
  // Another detector (the transport) declared the peer dead: take_dead() will not report it again,
  // and hearing from it again makes it revived.
  void mark_dead(const RankId& peer);
  size_t watched() const;

  static constexpr int64_t kHungFactor = 4;
  static constexpr int64_t kProbeIntervalMs = 50;
  // Whether something listens on a "tcp://HOST:PORT" endpoint (HOST: IPv4, [IPv6] or a host name;
  // a connect to one of its addresses within `timeout_ms` in all). Unparsable or unresolvable
  // endpoints, wildcards, port 0 and failed or timed-out connects are "no".
  static bool endpoint_accepts(const std::string& endpoint, int timeout_ms);

 private:
  struct Peer {
    std::string endpoint;
    int64_t last_heard_ns = 0;
    bool reported = false;
    bool revived = false;
    int64_t probed_ns = 0;     // last connect probe (0: none since last heard)
    bool probe_alive = false;  // its answer
  };
  void run();

  RankId self_;
  uint64_t incarnation_ = 1;
  Deadlines deadlines_;
  ListenAddress heartbeat_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<RankId, Peer> peers_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvferry
