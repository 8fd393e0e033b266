// Thread niceness (thread_priority.h). Linux keeps a niceness per thread: setpriority(PRIO_PROCESS,
// tid) changes only that thread.
#include "thread_priority.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

namespace kvferry {

int thread_nice(int tid) {
  const id_t id = static_cast<id_t>(tid == 0 ? gettid() : tid);
  errno = 0;
  const int n = getpriority(PRIO_PROCESS, id);
  return errno == 0 ? n : 0;
}

int raise_thread_priority(int tid, int nice) {
  const id_t id = static_cast<id_t>(tid == 0 ? gettid() : tid);
  const int before = thread_nice(tid);
  if (nice < before) (void)setpriority(PRIO_PROCESS, id, nice);  // EPERM/EACCES: keep it
  return thread_nice(tid);
}

std::vector<int> threads_named(std::string_view prefix) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(e.path() / "comm");
    std::string name;
    if (!std::getline(in, name) || name.compare(0, prefix.size(), prefix) != 0) continue;
    try {
      out.push_back(std::stoi(e.path().filename().string()));
    } catch (...) {  // not a number: not a thread directory
    }
  }
  return out;
}

}  // namespace kvferry
