// The orchestrator's side of planned peer deaths (orchestrator.h, fault plan kind peer_death):
// owns the orchestrator's ControlSocket, takes the router's kill requests
// (peer_death_frames.h), SIGKILLs that rank, notes the time (CLOCK_MONOTONIC) in a
// PeerDeathRecord (report.h), tells the router, and once the process is reaped and
// restart_delay_ms passed starts the same command line again (its log and stderr files are
// appended to; a half line the kill left at the end of its JSON log is set aside first). A rank
// of a restart@ item (fault_plan.h) is started again on the ports the killed process had bound
// (child_args.h restart_ports(): control, engine, metrics), read just before the kill.
// Thread contract: one thread (the orchestrator's main thread); the ProcessGroup is shared with
// the caller on that thread.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kvferry/control.h"
#include "kvferry/error.h"
#include "process/process.h"
#include "replay/replay_config.h"
#include "replay/report.h"

namespace kvferry::replay {

class PeerDeathExecutor {
 public:
  using Clock = std::chrono::steady_clock;
  // `t0`: the replay's start (PeerDeathRecord::killed_at_s). Progress lines go to `out`,
  // problems with the router's frames to `err`.
  PeerDeathExecutor(const ReplayConfig& c, process::ProcessGroup& group, std::ostream& out,
                    std::ostream& err, Clock::time_point t0);

  // Binds the orchestrator's socket (any port, on the replay's host address: kDefaultHost, or
  // with --hosts place.replay's, where the router reaches it) when the fault plan has a peer
  // death; does nothing otherwise. Errors: the bind's, with a message for the user (the replay
  // must run on that host).
  Status bind();
  bool active() const { return control_ != nullptr; }
  uint16_t port() const;  // 0 when not active
  void set_router_endpoint(std::string endpoint) { router_endpoint_ = std::move(endpoint); }

  // The child `file` (its DIR/logs file name) shown as `display`, started with `args`: what a
  // restart starts again. Called for every child (a leader again once its port is known).
  void set_command(const std::string& file, std::string display, std::vector<std::string> args);

  // Frames from the router (kill requests): waits up to `wait` for one, handles every one that
  // came. Sleeps `wait` when not active.
  void serve(std::chrono::milliseconds wait);

  // An exit the orchestrator caused (a planned kill): not a failure. Returns the line for the
  // report's process exits, nullopt for any other exit.
  std::optional<std::string> planned_exit(const process::ChildExit& e);

  // Restarts killed ranks whose delay passed (once reaped); `before_spawn(file)` runs just before
  // each start. Error (the message for the user): a rank could not be started again.
  Status restart_due(const std::function<void(const std::string& file)>& before_spawn);
  // The replay is over: a rank still down stays down.
  void cancel_restarts() { pending_restarts_.clear(); }

  const std::vector<PeerDeathRecord>& records() const { return deaths_; }

 private:
  struct Command {
    std::string display;
    std::vector<std::string> args;
  };
  struct PendingRestart {
    std::string file;
    size_t death = 0;  // index in deaths_
    Clock::time_point due;
    std::vector<std::string> pinned;  // restart@: the ports the killed process bound (child_args.h)
  };

  double elapsed_s() const;
  bool has_other_engine_peers(const std::string& rank);
  void tell_router(const std::string& type, const std::string& rank, int64_t time_ns,
                   const std::string& reason);
  void kill_rank(const std::string& rank);

  const ReplayConfig& c_;
  process::ProcessGroup& group_;
  std::ostream& out_;
  std::ostream& err_;
  Clock::time_point t0_;
  std::map<std::string, Command> commands_;  // file name -> display name and command line
  std::unique_ptr<ControlSocket> control_;   // null: no peer deaths planned
  std::string router_endpoint_;
  std::vector<PeerDeathRecord> deaths_;
  std::set<pid_t> planned_exits_;
  std::vector<PendingRestart> pending_restarts_;
};

}  // namespace kvferry::replay
