// EngineLoop: the main loop of one rank. Every iteration it waits (poll on the waker and the
// sockets, at most 1 ms), feeds control frames and transport completions to the endpoint, lets
// the driver do its local work, and runs the engine's step agreement:
//   leader (tp0): gathers every rank's reports, reduces and decides, applies the decisions itself,
//                 broadcasts them as the next step; forwards router requests as decisions and sends
//                 the router one RoomResult per released room, and "rank_up" when a follower it
//                 had declared dead says hello again (engine_protocol.h);
//   follower:     applies each step's decisions in order and replies with its reports.
// Failure fan-out: a rank that records a room's failure first-hand or from the other engine sends
// one "fail" frame straight to every other rank of its engine (the leader announces the members in
// its steps), which fail the room at once; the agreement still decides release and the result.
// Fail frames for a room a rank does not have yet are kept (at most kMaxEarlyFails, for
// kEarlyFailTtlNs) and applied when the step that creates the room arrives.
// Deadlines: a follower that does not reply for `peer_timeout_ms` is declared dead by the leader
// (its rooms fail); a leader that sends no step for 1.5 x `peer_timeout_ms` is declared dead by its
// followers. Busy is not dead (docs/testing.md, "Under load"): the silence counts only while the
// judging loop itself ran (core/stall_clock.h: gaps between its iterations beyond
// kStallAllowanceNs are not counted), so a host descheduled for seconds as a whole, every rank of
// the engine with it, does not make the ranks declare each other dead when they run again. And a
// silence past the deadline is confirmed as with heartbeats (endpoint/peer_monitor.h): a rank
// whose engine socket still accepts TCP connections (alive, not scheduled) is declared dead only
// after PeerMonitor::kHungFactor x the deadline; a killed one (refused) at the deadline.
// The rank is a caller-pumped Manager (kvferry/manager.h): the loop waits on its wait_fds() and the
// engine socket and calls its progress(). Thread contract: run() on the rank's main thread.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "driver/engine.h"
#include "kvferry/control.h"
#include "kvferry/manager.h"

namespace kvferry {

struct EngineLoopConfig {
  RankId self;
  uint32_t tp_size = 1;
  std::string engine_endpoint;  // the leader's; the leader binds it (port 0: any free port)
  std::string router_endpoint;
  int64_t step_interval_us = 1000;
  int64_t idle_step_interval_us = 20000;
  int64_t peer_timeout_ms = 30000;
  // The bound engine port is written here (kvferry/port_file.h): the leader's engine_endpoint
  // port, a follower's own engine socket.
  std::string port_file;
  uint16_t follower_port = 0;  // follower: the port its engine socket binds (0: any free port)
  // The engine socket's bind and advertised host (kvferry/net.h; empty: not given). The leader
  // binds engine_endpoint's port on bind_host (default: the endpoint's host) and advertises
  // advertise_host (default: the endpoint's host); a follower binds any port on bind_host
  // (default: kDefaultHost) and advertises advertise_host (default: its bind host).
  std::string bind_host;
  std::string advertise_host;
  uint32_t instance = 0;  // the engine's instance (xPyD replay), named in its ready and stats frames
};

class EngineLoop {
 public:
  EngineLoop(EngineLoopConfig config, Manager& manager, EngineDriver& driver);
  // Runs until shutdown; returns the process exit code.
  int run();
  // After run(): the shutdown was the router's "leave" (the rank then leaves in order, rank.cc).
  bool leaving() const { return leaving_; }

 private:
  int run_leader(ControlSocket& engine);
  int run_follower(ControlSocket& engine);
  void pump_local(ControlSocket& engine);
  void flush_outbox(ControlSocket& engine);  // the router's frames go out on the engine socket
  // Sends every failure the driver has to fan out to `to` (tp_rank -> engine endpoint).
  void fan_out(ControlSocket& engine, const std::map<uint32_t, std::string>& to);
  // A sibling's fail frame: applied now, or kept until the room exists here (bounded).
  void on_sibling_fail(const SiblingFailure& f, int64_t now);
  // Applies kept fail frames whose room exists now; drops expired ones.
  void retry_early_fails(int64_t now);
  // Whether a silent member's engine socket still accepts a connection (probed at most every
  // PeerMonitor::kProbeIntervalMs per endpoint).
  bool still_alive(const std::string& endpoint, int64_t now);
  // Follower: the leader's new member list; opens connections to new siblings.
  void set_siblings(ControlSocket& engine, const std::vector<EngineMember>& members);

  static constexpr size_t kMaxEarlyFails = 256;
  // An iteration waits at most 1 ms; one that comes later than this after the last was a stall.
  static constexpr int64_t kStallAllowanceNs = 50'000'000;
  static constexpr size_t kMaxProbes = 64;
  static constexpr int64_t kEarlyFailTtlNs = 2'000'000'000;

  EngineLoopConfig cfg_;
  bool leaving_ = false;
  Manager& manager_;
  EngineDriver& driver_;
  std::vector<std::string> outbox_;  // frames for the router not yet accepted
  std::map<uint32_t, std::string> siblings_;  // follower: the other followers' engine endpoints
  std::deque<std::pair<int64_t, SiblingFailure>> early_fails_;  // (arrival ns, frame), oldest first
  std::map<std::string, std::pair<int64_t, bool>> probes_;  // endpoint -> (probed ns, accepted)
};

}  // namespace kvferry
