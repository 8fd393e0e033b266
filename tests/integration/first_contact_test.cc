// A decode rank's first contact with a prefill rank that is slow to answer it (main ae06193,
// src/endpoint/decode_refusal.cc resend_unanswered). A decode rank sends its pool registration to
// a prefill rank once, when it first looks the prefill instance up; the prefill rank heartbeats it
// only once it accepted that registration. The control socket holds a frame to a new destination
// while the connection comes up and drops it if the connection is not up within its first 1 s
// (include/kvferry/control.h, ControlSocket::send). On a busy machine a first connection can take
// longer: the registration was lost, the prefill rank never heartbeated the decode rank, and the
// decode rank declared it dead (after kHungFactor x heartbeat_timeout: its endpoint still
// accepted) and failed its rooms. With the fix, a source not heard from since the registration is
// sent the same registration again every second until it answers.
//
// Here the prefill rank is a real process (a forked child hosting a kvferry::Manager through the
// public API) which the test stops (SIGSTOP) before the decode rank is created: the kernel still
// accepts the decode rank's TCP connection, but the child's ZeroMQ I/O threads do not run, so the
// ZMTP handshake cannot complete until the child is continued, well after the 1 s window. What
// must hold, by events: the prefill rank accepts the decode rank's registration once it runs again
// (within a generous deadline that is still shorter than the decode rank's 4 x heartbeat_timeout
// patience), the decode rank never declares it dead, and a room then goes end to end, byte-exact.
// Thread contract: the test's thread (the managers run their own progress threads).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/bootstrap.h"
#include "kvferry/content.h"
#include "kvferry/log.h"
#include "kvferry/manager.h"

namespace kvferry_itest {
namespace {

using namespace kvferry;
using namespace std::chrono_literals;

constexpr uint32_t kPageSize = 4;
constexpr uint64_t kRoom = 42;
const std::vector<uint64_t> kSourcePages{1, 2, 3};  // the child's pages of the room
const std::vector<uint64_t> kDestPages{4, 5, 6};    // the decode rank's
constexpr uint64_t kAuxIndex = 1;
// Long enough that the decode rank's patience with a silent prefill whose endpoint accepts
// (kHungFactor x this: 12 s, src/endpoint/peer_monitor.h) is well past the child's stop.
constexpr int64_t kHeartbeatTimeoutMs = 3000;
// How long the child stays stopped: past the control socket's 1 s first-contact window. A setup
// delay only; nothing is asserted about how long anything takes.
constexpr auto kStopped = 2500ms;

// What the child reports on its pipe.
constexpr char kReady = 'R';      // its manager is up and registered at the bootstrap service
constexpr char kAccepted = 'P';   // stats().peers became 1: it accepted the decode registration
constexpr char kRoomOk = 'S';     // the room concluded Success at the prefill rank
constexpr char kFailed = 'F';     // something went wrong in the child (a line of text follows)

ModelGeometry tiny_model() {
  ModelGeometry m;
  m.name = "first-contact-tiny";
  m.attention = "GQA";
  m.num_layers = 2;
  m.tensors_per_layer = 2;
  m.cache_heads = 4;
  m.head_dim = 16;
  m.dtype_bytes = 2;
  return m;
}

ManagerConfig rank_config(Role role, const std::string& bootstrap) {
  ManagerConfig c;
  c.self = {role, 0, 0, 0};
  c.model = tiny_model();
  c.page_size = kPageSize;
  c.pool_bytes = 1ull << 20;
  c.aux_rows = 16;
  c.transport = "shm";
  c.control.bind_host = "127.0.0.1";
  c.bootstrap_address = bootstrap;
  c.deadlines.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
  c.deadlines.connect_timeout_ms = 30000;  // a loaded host
  return c;
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes, waiting at most until `deadline`. False on EOF, error or deadline.
bool read_all(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) continue;
    ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// ---- the child: a prefill rank ------------------------------------------------------------------

void report(int fd, char what, const std::string& text = {}) {
  (void)write_all(fd, &what, 1);
  if (what == kFailed) {
    const std::string line = text + "\n";
    (void)write_all(fd, line.data(), line.size());
  }
}

// Serves room kRoom: a sender, its pages filled as fill_page writes them, one last send, until
// Success. Returns "" or what went wrong.
std::string serve_room(Manager& m) {
  auto tx = m.sender(kRoom);
  if (!tx.ok()) return "sender: " + tx.status().str();
  Sender& s = **tx;
  const PoolLayout& l = m.layout();
  for (size_t i = 0; i < kSourcePages.size(); ++i)
    for (uint32_t b = 0; b < l.num_buffers(); ++b)
      fill_page(l, kRoom, b, i * l.page_size, m.pool_base() + l.page_offset(b, kSourcePages[i]));
  if (Status st = s.init(kSourcePages.size(), kAuxIndex); !st.ok()) return "init: " + st.str();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (s.poll() == KVPoll::Bootstrapping && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  if (s.poll() != KVPoll::WaitingForInput) return "prefill room " + std::string(to_string(s.poll()));
  if (Status st = s.send(kSourcePages, {}, true); !st.ok()) return "send: " + st.str();
  while (s.poll() != KVPoll::Success && s.poll() != KVPoll::Failed && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  if (s.poll() != KVPoll::Success) {
    auto f = s.failure();
    return "prefill room " + std::string(to_string(s.poll())) + (f ? ": " + f->failure().describe() : "");
  }
  while (!s.release_safe() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  return "";
}

// Reads the bootstrap port from `cmd_fd`, hosts the prefill rank, reports on `report_fd`, serves
// the room when asked ('r' on `cmd_fd`), and runs until killed (or the parent goes).
[[noreturn]] void prefill_child(int cmd_fd, int report_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) ::_exit(3);
  uint16_t port = 0;
  if (!read_all(cmd_fd, &port, sizeof port, std::chrono::steady_clock::now() + 60s)) ::_exit(4);
  std::unique_ptr<Manager> m;
  {
    auto created = Manager::create(rank_config(Role::kPrefill, "127.0.0.1:" + std::to_string(port)));
    if (!created.ok()) {
      report(report_fd, kFailed, "prefill create: " + created.status().str());
      ::_exit(5);
    }
    m = std::move(created).value();
  }
  report(report_fd, kReady);
  bool accepted = false;
  for (;;) {
    if (!accepted && m->stats().peers >= 1) {
      accepted = true;
      report(report_fd, kAccepted);
    }
    pollfd pfd{cmd_fd, POLLIN, 0};
    if (::poll(&pfd, 1, 2) > 0) {
      char c = 0;
      if (::read(cmd_fd, &c, 1) != 1) ::_exit(0);  // the parent went
      if (c == 'r') {
        const std::string why = serve_room(*m);
        if (why.empty()) report(report_fd, kRoomOk);
        else report(report_fd, kFailed, why);
      }
    }
  }
}

// ---- the parent ---------------------------------------------------------------------------------

// The child, continued and killed whatever way the test ends.
struct ChildGuard {
  pid_t pid = -1;
  ~ChildGuard() {
    if (pid <= 0) return;
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGKILL);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
  }
};

// The decode process's log lines that matter here, from any thread.
struct DecodeLog {
  std::atomic<uint64_t> peer_dead{0};   // a peer declared dead (event peer_dead)
  std::atomic<uint64_t> resent{0};      // the registration sent again (resend_unanswered)
  DecodeLog() {
    set_log_callback(
        [this](LogLevel level, std::string_view comp, std::string_view msg, const LogFields& f) {
          if (level > LogLevel::kDebug)  // as the stderr sink would have shown them
            std::fprintf(stderr, "decode process: %.*s: %.*s\n", static_cast<int>(comp.size()), comp.data(),
                         static_cast<int>(msg.size()), msg.data());
          for (const auto& [k, v] : f.extra)
            if (k == "event" && v == "peer_dead") ++peer_dead;
          if (msg.find("not heard from since the pool registration") != msg.npos) ++resent;
        },
        LogLevel::kDebug);
  }
  ~DecodeLog() { set_log_callback({}); }
};

// The child's next report: its byte, and the text of a failure.
std::string next_report(int fd, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char c = 0;
  if (!read_all(fd, &c, 1, deadline)) return "none within " + std::to_string(limit.count()) + " s";
  if (c != kFailed) return std::string(1, c);
  std::string text(1, c);
  while (read_all(fd, &c, 1, deadline) && c != '\n') text += c;
  return text;
}

TEST(FirstContact, RegistrationLostToASlowFirstConnectionIsSentAgain) {
  // fork() before this process starts any thread (the bootstrap service, ZeroMQ, UCX).
  int cmd[2], rep[2];
  ASSERT_EQ(::pipe2(cmd, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(rep, O_CLOEXEC), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(cmd[1]);
    ::close(rep[0]);
    prefill_child(cmd[0], rep[1]);
  }
  ::close(cmd[0]);
  ::close(rep[1]);
  ChildGuard child{pid};
  struct Fds {
    int a, b;
    ~Fds() {
      ::close(a);
      ::close(b);
    }
  } fds{cmd[1], rep[0]};

  auto server = BootstrapServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().str();
  const std::string bootstrap = "127.0.0.1:" + std::to_string((*server)->port());
  const uint16_t port = (*server)->port();
  ASSERT_TRUE(write_all(cmd[1], &port, sizeof port));
  ASSERT_EQ(next_report(rep[0], 60s), std::string(1, kReady));

  // The prefill rank is registered at the service; stop it before the decode rank first contacts it.
  DecodeLog log;
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(st));

  // create() looks the prefill rank up (the service runs here) and sends its registration, which
  // the control socket holds while the connection to the stopped child cannot come up.
  auto created = Manager::create(rank_config(Role::kDecode, bootstrap));
  ASSERT_TRUE(created.ok()) << created.status().str();
  std::unique_ptr<Manager> decode = std::move(created).value();
  std::this_thread::sleep_for(kStopped);  // past the first-contact window: the held registration is dropped
  ASSERT_EQ(::kill(pid, SIGCONT), 0);

  // The registration gets through once the child runs again: without the fix nothing sends it
  // again until the decode rank has declared the prefill rank dead (4 x heartbeat_timeout).
  const std::string accepted = next_report(rep[0], 30s);
  const ManagerStats ds = decode->stats();
  ASSERT_EQ(accepted, std::string(1, kAccepted))
      << "the prefill rank never accepted the decode rank's pool registration; registration resends logged: "
      << log.resent.load() << ", peers declared dead: " << log.peer_dead.load();
  EXPECT_EQ(log.peer_dead.load(), 0u) << "the decode rank declared the prefill rank dead before it was registered";
  // The scenario happened: the first registration was lost with the stopped child's first contact.
  EXPECT_GE(log.resent.load(), 1u) << "the registration was never sent again: no slow first contact reproduced";
  ASSERT_EQ(ds.prefill_instances.size(), 1u);
  EXPECT_EQ(ds.prefill_instances[0].bootstrap, bootstrap);
  EXPECT_EQ(ds.prefill_instances[0].peers, 1u);
  EXPECT_EQ(ds.prefill_instances[0].dead_peers, 0u);

  // One room end to end: the decode rank's receiver, the child's sender.
  auto rx = decode->receiver(kRoom, bootstrap);
  ASSERT_TRUE(rx.ok()) << rx.status().str();
  ASSERT_TRUE((*rx)->init().ok());
  ASSERT_TRUE((*rx)->send_metadata(kDestPages, kAuxIndex, {}).ok());
  ASSERT_TRUE(write_all(cmd[1], "r", 1));
  const std::string served = next_report(rep[0], 60s);
  EXPECT_EQ(served, std::string(1, kRoomOk));
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!(*rx)->release_safe() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_EQ((*rx)->poll(), KVPoll::Success) << ((*rx)->failure() ? (*rx)->failure()->failure().describe() : "");
  const PoolLayout& l = decode->layout();
  uint64_t bad = 0;
  for (size_t i = 0; i < kDestPages.size(); ++i)
    for (uint32_t b = 0; b < l.num_buffers(); ++b)
      bad += verify_page(l, kRoom, b, i * l.page_size, decode->pool_base() + l.page_offset(b, kDestPages[i]));
  EXPECT_EQ(bad, 0u) << "bytes of the room differ at the decode rank";
  EXPECT_EQ(log.peer_dead.load(), 0u);
  EXPECT_EQ(decode->stats().prefill_instances.at(0).dead_peers, 0u);
}

}  // namespace
}  // namespace kvferry_itest
