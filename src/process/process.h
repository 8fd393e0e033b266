// Child processes of the replay orchestrator and the benchmark: spawn into one process group, supervise, stop.
//
// Every child: its own process group shared with its siblings (the first child leads it),
// PR_SET_PDEATHSIG = SIGKILL (dies with the orchestrator's thread that spawned it), stdin from
// /dev/null, stdout and stderr appended to one file, no inherited descriptors above 2, default
// signal dispositions and an empty signal mask.
// Thread contract: a ProcessGroup belongs to one thread (the one that spawns: PDEATHSIG is tied to
// the spawning thread). Errors: kInternal for failed system calls.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::process {

struct ChildExit {
  std::string name;
  pid_t pid = 0;
  int exit_code = -1;  // when exited normally, else -1
  int signal = 0;      // when killed by a signal, else 0
  bool ok() const { return signal == 0 && exit_code == 0; }
  std::string describe() const;  // "exited with code 1" / "was killed by signal 9 (Killed)"
};

class ProcessGroup {
 public:
  ProcessGroup() = default;
  ~ProcessGroup();  // kill_all(SIGKILL) and reaps whatever is left
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts `exe` with `args` (args[0] is argv[0]); output goes to `output_path` (created and
  // truncated, or appended to with `append`). A name may be spawned again once its previous
  // child exited (a restart); pid_of() and running() then refer to the newest.
  // `exec_prefix` (e.g. {"ip", "netns", "exec", "NS"}; empty: none): the child execs
  // exec_prefix[0] (found in PATH, before the fork) with argv exec_prefix + args, and args[0] is
  // replaced by `exe`. The prefix must exec the command in place (not fork it), so the pid, the
  // signals sent to it and PR_SET_PDEATHSIG reach the command itself; `ip netns exec` does.
  // Errors: kInvalidArgument when exec_prefix[0] is not an executable in PATH.
  Result<pid_t> spawn(const std::string& name, const std::string& exe,
                      const std::vector<std::string>& args, const std::string& output_path,
                      bool append = false, const std::vector<std::string>& exec_prefix = {});

  // Reaps children that exited, without blocking; returns them in the order reaped.
  std::vector<ChildExit> reap();
  // Like reap() but waits up to `timeout` until `name`'s child exited (other exits are returned too).
  std::vector<ChildExit> wait_for(const std::string& name, std::chrono::milliseconds timeout);

  bool running(const std::string& name) const;
  size_t running_count() const;
  std::optional<pid_t> pid_of(const std::string& name) const;  // the newest child of that name
  pid_t pgid() const { return pgid_; }

  // Sends `sig` to one child / to every running child (the group and each pid).
  void signal(const std::string& name, int sig);
  void signal_all(int sig);
  // SIGTERM to all, wait up to `grace`, then SIGKILL and reap all. Returns every exit reaped.
  std::vector<ChildExit> stop_all(std::chrono::milliseconds grace);

 private:
  struct Child {
    std::string name;
    pid_t pid = 0;
    bool running = true;
  };
  std::vector<Child> children_;
  pid_t pgid_ = 0;
};

// Last `max_lines` lines of a text file ("" when unreadable).
std::string tail_file(const std::string& path, size_t max_lines);

// Reserves `count` distinct free TCP ports on IPv4 loopback (bound together, then released).
Result<std::vector<uint16_t>> pick_free_ports(size_t count);

// True when something accepts TCP connections on IPv4 loopback, port `port`.
bool port_accepts(uint16_t port);

// The path execvp() would run for `name`: `name` itself when it has a '/', else the first
// executable PATH entry (PATH unset: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin).
// Errors: kInvalidArgument naming the command and the PATH searched.
Result<std::string> find_executable(const std::string& name);

// Path of the running executable (/proc/self/exe resolved).
std::string self_exe();

}  // namespace kvferry::process
