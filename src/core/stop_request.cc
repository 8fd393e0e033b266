#include "core/stop_request.h"

#include <signal.h>

#include <atomic>

namespace kvferry {
namespace {
std::atomic<int> g_stop{0};  // lock-free, so async-signal-safe
static_assert(std::atomic<int>::is_always_lock_free);
void on_stop(int sig) { g_stop.store(sig); }
}  // namespace

void install_stop_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
}

void request_stop(int sig) { g_stop.store(sig); }

bool stop_requested() { return g_stop.load() != 0; }
int stop_signal() { return g_stop.load(); }

}  // namespace kvferry
