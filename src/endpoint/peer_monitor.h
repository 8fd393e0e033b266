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
// A probe that gets no answer at all (no SYN-ACK within its budget, or no route: a link down or a
// partition) proves neither: the network is silent, not the peer. Such a suspect is reported after
// kUnreachableFactor x heartbeat_timeout. The factor covers TCP's retransmission backoff: a link
// that was down for less than the heartbeat timeout leaves the heartbeat stream silent for up to
// about twice as long (the segments lost during the outage are resent only at the next doubled
// retransmission timeout), while a new connect (the probe) is answered as soon as the link is
// back. So a short outage loses nothing, and a partition longer than kUnreachableFactor x the
// timeout is always reported (docs/failure-model.md, "Network faults").
// (The kernel closes a killed process's sockets only after it has unmapped its memory: measured on
// the 2-core test VM, about 1.1 s for a process with 128 MiB or more mapped, 50-90 ms below; until
// then the probe still says "alive" and the report waits for the refusal, or kHungFactor.)
// The probe resolves the endpoint's host (a host name, IPv4 or IPv6 literal: getaddrinfo) and tries
// each of its addresses within the probe's budget; any that accepts means alive. A host name is
// resolved at each probe (fast from /etc/hosts; a slow DNS resolver would delay take_dead()).
// Busy is not dead (docs/testing.md, "Under load"):
//   - silence is counted only while this process was being scheduled: the heartbeat thread
//     measures how late it wakes (gaps beyond 2 x heartbeat_interval between its wake-ups:
//     core/stall_clock.h), and a peer's silence does not include those stalls. When a whole host
//     or VM is descheduled for seconds, the peers were too, and nobody is blamed for it. (A main
//     thread that is merely busy needs no such credit: frames wait in ZeroMQ's queue and are
//     drained, stamped with the drain time, before take_dead() judges.)
//   - the heartbeat thread and the process's ZeroMQ I/O threads (which carry every heartbeat out and
//     in) run at niceness kLivenessNice (env KVFERRY_LIVENESS_NICE, -20..0; 0 leaves them alone)
//     where the process may raise priorities (root / CAP_SYS_NICE; core/thread_priority.h),
//     otherwise at their own, quietly.
//   - stats() counts what the liveness path saw: gaps between frames from each peer (p50, p99,
//     max), suspicions, probes that found a busy peer alive, reports, revivals, own stalls; the
//     destructor logs them in one debug line ("liveness: ...").
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

#include "core/stall_clock.h"
#include "core/tcp_probe.h"
#include "kvferry/deadlines.h"
#include "kvferry/error.h"
#include "kvferry/net.h"

namespace kvferry {

struct DeadPeer {
  RankId peer;
  int64_t silent_ms = 0;
};

// What the liveness path of one rank observed (PeerMonitor::stats()). Times in ms.
struct LivenessStats {
  uint64_t gaps = 0;  // intervals between two frames heard from the same peer
  double gap_p50_ms = 0, gap_p99_ms = 0, gap_max_ms = 0;
  uint64_t suspected = 0;     // silences longer than heartbeat_timeout (once per silence)
  uint64_t probed_alive = 0;  // of those, the peer's endpoint still accepted: busy, not reported
  uint64_t probed_silent = 0;  // of those, the probe got no answer (a silent network), at first
  uint64_t reported = 0;      // peers reported dead by take_dead()
  uint64_t revived = 0;       // reported peers heard from again (a false death or a healed link)
  double stalled_ms = 0, max_stall_ms = 0;  // this rank's own stalls, not counted as silence
  int heartbeat_nice = 0;  // the heartbeat thread's niceness (negative: raised)
  int io_nice = 0;         // the ZeroMQ I/O threads' niceness (the highest of them)
  uint64_t heartbeats_sent = 0;  // heartbeat frames queued to peers so far (one per peer per period)
};

class PeerMonitor {
 public:
  struct Options {
    bool stall_credit = true;  // false: silences are wall time (tests of exact thresholds)
    uint64_t incarnation = 1;  // this rank's, carried by every heartbeat (kvferry/messages.h; 0: 1)
  };
  // `incarnation`: as Options::incarnation.
  PeerMonitor(RankId self, const Deadlines& deadlines, ListenAddress heartbeat = {}, uint64_t incarnation = 1);
  PeerMonitor(RankId self, const Deadlines& deadlines, ListenAddress heartbeat, Options options);
  ~PeerMonitor();
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  void watch(const RankId& peer, const std::string& control_endpoint);
  void unwatch(const RankId& peer);
  // A frame from `peer`. Anyone can send a frame in a peer's name without the cluster secret, so a
  // peer reported dead is revived only by a `proven` hearing: its known incarnation's answer to a
  // challenge of this rank (docs/security.md, "Checked without the secret"); any other frame from
  // it only asks for that proof (take_unproven()) and changes nothing.
  void heard(const RankId& peer, int64_t now_ns, bool proven = false);
  // Peers reported dead that sent an unproven frame since the last call: challenge them.
  std::vector<RankId> take_unproven();
  // When `peer` was last heard (heard(); 0: never, or not watched).
  int64_t last_heard_ns(const RankId& peer) const;
  std::vector<DeadPeer> take_dead(int64_t now_ns);
  // Peers reported dead that were heard from again since (a transient silence, not a death).
  std::vector<RankId> take_revived();
  // Another detector (the transport) declared the peer dead: take_dead() will not report it again,
  // and hearing from it again makes it revived.
  void mark_dead(const RankId& peer);
  size_t watched() const;
  LivenessStats stats() const;
  // One wake-up of the heartbeat thread at real time `now_ns` (its stalls are credited to every
  // silence); tests call it to stand for a stall.
  void tick_stall_clock(int64_t now_ns);

  static constexpr int64_t kHungFactor = 4;
  static constexpr int64_t kUnreachableFactor = 2;
  static constexpr int64_t kProbeIntervalMs = 50;
  static constexpr int kLivenessNice = -10;
  // What a TCP connect to a peer's endpoint found (core/tcp_probe.h).
  using Probe = TcpProbe;
  static Probe probe(const std::string& endpoint, int timeout_ms);
  // probe(endpoint, timeout_ms) == Probe::kAccepts.
  static bool endpoint_accepts(const std::string& endpoint, int timeout_ms);

 private:
  struct Peer {
    std::string endpoint;
    int64_t last_heard_ns = 0;
    bool reported = false;
    bool revived = false;
    bool unproven = false;  // reported, and a frame in its name came since (take_unproven())
    int64_t probed_ns = 0;     // last connect probe (0: none since last heard)
    Probe probe = Probe::kRefused;  // its answer
    bool heard_once = false;   // last_heard_ns is a frame's, not watch()'s
    bool suspected = false;    // this silence was counted in stats
    int64_t stalled_at = 0;    // stall_.stalled_ns() when last heard
  };
  // Gaps between frames of one peer: 1 ms buckets below 1 s, 10 ms ones below 10 s, then one.
  struct GapHistogram {
    static constexpr size_t kFine = 1000, kCoarse = 900;
    uint64_t buckets[kFine + kCoarse + 1] = {};
    uint64_t count = 0;
    int64_t max_ns = 0;
    void add(int64_t gap_ns);
    double percentile_ms(double q) const;
  };
  void run();

  RankId self_;
  uint64_t incarnation_ = 1;
  Deadlines deadlines_;
  ListenAddress heartbeat_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<RankId, Peer> peers_;
  StallClock stall_;
  GapHistogram gaps_;
  LivenessStats counts_;  // the counters; gaps and stalls are filled in by stats()
  int nice_ = kLivenessNice;
  Options options_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvferry
