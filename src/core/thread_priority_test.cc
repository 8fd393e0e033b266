// thread_priority: the calling thread's niceness really changes (as root, as CI and this machine
// run; otherwise it must stay as it was), only that thread's, and threads are found by name.
#include "thread_priority.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <gtest/gtest.h>
#include <thread>

namespace kvferry {
namespace {

bool may_raise() {
  rlimit r{};
  return geteuid() == 0 || (getrlimit(RLIMIT_NICE, &r) == 0 && r.rlim_cur > 20);
}

TEST(ThreadPriority, RaisesOnlyTheCallingThreadWhereAllowed) {
  const int main_before = thread_nice(0);
  std::promise<int> got;
  std::thread t([&] { got.set_value(raise_thread_priority(0, -5)); });
  t.join();
  const int after = got.get_future().get();
  if (may_raise()) {
    EXPECT_EQ(after, -5);
  } else {
    EXPECT_EQ(after, main_before);
  }
  EXPECT_EQ(thread_nice(0), main_before);  // the other threads keep theirs
}

TEST(ThreadPriority, NeverLowersAThreadAlreadyHigher) {
  std::promise<std::pair<int, int>> got;
  std::thread t([&] {
    const int first = raise_thread_priority(0, -5);
    got.set_value({first, raise_thread_priority(0, -2)});
  });
  t.join();
  const auto [first, second] = got.get_future().get();
  EXPECT_EQ(second, first);
}

TEST(ThreadPriority, FindsThreadsByName) {
  std::atomic<bool> stop{false};
  std::promise<int> tid;
  std::thread t([&] {
    pthread_setname_np(pthread_self(), "kvf-prio-test");
    tid.set_value(gettid());
    while (!stop) std::this_thread::yield();
  });
  const int id = tid.get_future().get();
  const auto found = threads_named("kvf-prio");
  stop = true;
  t.join();
  EXPECT_EQ(found, std::vector<int>{id});
  EXPECT_TRUE(threads_named("no-such-thread-name").empty());
}

}  // namespace
}  // namespace kvferry
