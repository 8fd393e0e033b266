// ProcessGroup: fork+exec children into one process group and supervise them (process.h).
#include "process/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace kvferry::process {
namespace {

Status sys_error(const std::string& what) {
  return {ErrorCode::kInternal, what + ": " + std::strerror(errno)};
}

// Async-signal-safe write of a C string to fd 2 (child between fork and exec).
void child_say(const char* a, const char* b) {
  auto put = [](const char* s) {
    size_t n = std::strlen(s);
    while (n > 0) {
      ssize_t w = ::write(2, s, n);
      if (w <= 0) return;
      s += w;
      n -= static_cast<size_t>(w);
    }
  };
  put(a);
  put(b);
  put("\n");
}

}  // namespace

std::string ChildExit::describe() const {
  if (signal != 0) {
    const char* d = strsignal(signal);
    return "was killed by signal " + std::to_string(signal) + " (" + (d ? d : "?") + ")";
  }
  return "exited with code " + std::to_string(exit_code);
}

ProcessGroup::~ProcessGroup() {
  if (running_count() > 0) stop_all(std::chrono::milliseconds(0));
}

Result<pid_t> ProcessGroup::spawn(const std::string& name, const std::string& exe,
                                  const std::vector<std::string>& args,
                                  const std::string& output_path, bool append,
                                  const std::vector<std::string>& exec_prefix) {
  if (args.empty()) return Status(ErrorCode::kInvalidArgument, "spawn " + name + ": empty argv");
  std::string program = exe;
  std::vector<std::string> full = args;
  if (!exec_prefix.empty()) {
    auto found = find_executable(exec_prefix[0]);
    if (!found.ok()) {
      return Status(ErrorCode::kInvalidArgument, "spawn " + name + " through its exec prefix: " +
                                                     found.status().message());
    }
    program = *found;
    full = exec_prefix;
    full.push_back(exe);
    full.insert(full.end(), args.begin() + 1, args.end());
  }
  std::vector<char*> argv;
  argv.reserve(full.size() + 1);
  for (const auto& a : full) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  if (running(name)) {
    return Status(ErrorCode::kInvalidArgument, "spawn " + name + ": already running");
  }
  const int out = ::open(output_path.c_str(),
                         O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (out < 0) return sys_error("cannot open " + output_path);
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) {
    ::close(out);
    return sys_error("cannot open /dev/null");
  }
  // The group lives while any unreaped member does; with none left the next child starts a new one.
  if (running_count() == 0) pgid_ = 0;
  const pid_t parent = ::getpid();
  const pid_t group = pgid_;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out);
    ::close(devnull);
    return sys_error("fork for " + name);
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only until exec.
    if (::setpgid(0, group) != 0) {
      child_say("kvferry: cannot join the replay's process group: ", std::strerror(errno));
      ::_exit(126);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(125);  // orchestrator already gone
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s) {
      if (s != SIGKILL && s != SIGSTOP) ::sigaction(s, &dfl, nullptr);
    }
    ::dup2(devnull, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::close_range(3, ~0U, 0);
    ::execv(program.c_str(), argv.data());
    child_say("kvferry: exec failed: ", std::strerror(errno));
    ::_exit(127);
  }
  ::close(out);
  ::close(devnull);
  // Also from the parent, so the group exists when spawn() returns (no race with the child).
  const pid_t want = group == 0 ? pid : group;
  if (::setpgid(pid, want) != 0 && errno != EACCES && errno != ESRCH) {
    // EACCES: the child already exec'd (it set its group itself); ESRCH: it already exited.
    const Status st = sys_error("setpgid for " + name);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return st;
  }
  if (pgid_ == 0) pgid_ = pid;
  children_.push_back({name, pid, true});
  return pid;
}

std::vector<ChildExit> ProcessGroup::reap() {
  std::vector<ChildExit> exits;
  for (auto& c : children_) {
    if (!c.running) continue;
    int st = 0;
    const pid_t r = ::waitpid(c.pid, &st, WNOHANG);
    if (r == 0) continue;
    ChildExit e;
    e.name = c.name;
    e.pid = c.pid;
    if (r == c.pid) {
      if (WIFEXITED(st)) e.exit_code = WEXITSTATUS(st);
      if (WIFSIGNALED(st)) e.signal = WTERMSIG(st);
    } else {
      e.exit_code = -1;  // ECHILD: someone else reaped it; treat as gone
    }
    c.running = false;
    exits.push_back(std::move(e));
  }
  return exits;
}

std::vector<ChildExit> ProcessGroup::wait_for(const std::string& name,
                                              std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<ChildExit> all;
  while (true) {
    auto e = reap();
    all.insert(all.end(), e.begin(), e.end());
    if (!running(name) || std::chrono::steady_clock::now() >= deadline) return all;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool ProcessGroup::running(const std::string& name) const {
  for (const auto& c : children_) {
    if (c.name == name && c.running) return true;
  }
  return false;
}

size_t ProcessGroup::running_count() const {
  size_t n = 0;
  for (const auto& c : children_) n += c.running ? 1 : 0;
  return n;
}

std::optional<pid_t> ProcessGroup::pid_of(const std::string& name) const {
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    if (it->name == name) return it->pid;
  }
  return std::nullopt;
}

void ProcessGroup::signal(const std::string& name, int sig) {
  for (const auto& c : children_) {
    if (c.name == name && c.running) ::kill(c.pid, sig);
  }
}

void ProcessGroup::signal_all(int sig) {
  // The group stays valid while any unreaped member exists, so -pgid cannot hit a stranger.
  if (running_count() == 0) return;
  if (pgid_ > 0) ::kill(-pgid_, sig);
  for (const auto& c : children_) {
    if (c.running) ::kill(c.pid, sig);
  }
}

std::vector<ChildExit> ProcessGroup::stop_all(std::chrono::milliseconds grace) {
  std::vector<ChildExit> all;
  signal_all(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (running_count() > 0 && std::chrono::steady_clock::now() < deadline) {
    auto e = reap();
    all.insert(all.end(), e.begin(), e.end());
    if (running_count() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  signal_all(SIGKILL);
  for (auto& c : children_) {
    if (!c.running) continue;
    int st = 0;
    ChildExit e;
    e.name = c.name;
    e.pid = c.pid;
    if (::waitpid(c.pid, &st, 0) == c.pid) {
      if (WIFEXITED(st)) e.exit_code = WEXITSTATUS(st);
      if (WIFSIGNALED(st)) e.signal = WTERMSIG(st);
    }
    c.running = false;
    all.push_back(std::move(e));
  }
  return all;
}

std::string tail_file(const std::string& path, size_t max_lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > 65536 ? size - 65536 : 0;
  in.seekg(start);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  std::vector<std::string> lines;
  std::istringstream lines_in(text);
  for (std::string line; std::getline(lines_in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  const size_t first = lines.size() > max_lines ? lines.size() - max_lines : 0;
  std::string out;
  for (size_t i = first; i < lines.size(); ++i) {
    out += lines[i];
    if (i + 1 < lines.size()) out += '\n';
  }
  return out;
}

Result<std::vector<uint16_t>> pick_free_ports(size_t count) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  Status st;
  for (size_t i = 0; i < count && st.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      st = sys_error("socket");
      break;
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      st = sys_error("bind loopback port 0");
      break;
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) ::close(fd);
  if (!st.ok()) return st;
  return ports;
}

bool port_accepts(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

Result<std::string> find_executable(const std::string& name) {
  if (name.empty()) return Status(ErrorCode::kInvalidArgument, "empty command name");
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return name;
    return Status(ErrorCode::kInvalidArgument, name + " is not an executable file");
  }
  const char* env = std::getenv("PATH");
  const std::string path = env && *env ? env : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  std::istringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return Status(ErrorCode::kInvalidArgument, "'" + name + "' is not an executable in PATH (" + path + ")");
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace kvferry::process
