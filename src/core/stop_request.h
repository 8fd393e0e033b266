// SIGTERM and SIGINT as a request to stop, for the processes a replay spawns (ranks, router): the
// handler only sets a flag; the main loop sees it, finishes its step, flushes its logs (and a
// rank its metrics file) and exits with 128 + the signal. This is how `kvferry replay` stops its
// children cleanly on Ctrl-C (docs/report.md).
// Thread contract: install once from the main thread; stop_requested() from any thread.
#pragma once

namespace kvferry {

void install_stop_handler();
// The same request from code (e.g. a thread that received the signal with sigwait).
void request_stop(int sig);
bool stop_requested();
int stop_signal();  // the signal that asked (0: none)

}  // namespace kvferry
