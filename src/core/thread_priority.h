// Scheduling priority for the few latency-critical threads of a rank (docs/testing.md, "Under
// load"): the peer monitor's heartbeat sender and the control plane's ZeroMQ I/O thread, which
// sleep nearly all the time and must run at once when they wake, however busy the host is.
//
// raise_thread_priority() lowers a thread's niceness to `nice` (e.g. -10: about 10x the CPU share
// of a nice-0 spinner, and an earlier virtual deadline on wake-up under the kernel's fair
// scheduler). Only a process with CAP_SYS_NICE (root) or an RLIMIT_NICE allowing it may; otherwise
// the thread keeps its niceness, quietly (not being allowed is a normal state, not an error).
// Returns the thread's niceness afterwards. Bulk threads go the other way (job_worker.cc: nice 10,
// the UCX progress thread: nice 5).
// Thread contract: any thread; `tid` is a thread of this process (0: the calling thread).
#pragma once
#include <string_view>
#include <vector>

namespace kvferry {

int raise_thread_priority(int tid, int nice);
// The threads of this process whose name (/proc/self/task/TID/comm) starts with `prefix`.
std::vector<int> threads_named(std::string_view prefix);
// The niceness of thread `tid` (0: the calling thread).
int thread_nice(int tid);

}  // namespace kvferry
