// Two real processes: the parent writes into a region owned by a child process (shm is the real
// use: prefill and decode ranks are separate processes on one host). The child is this binary
// re-executed (fork + exec, so it starts with clean UCX state) in "child mode", selected by the
// environment before GoogleTest's main runs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kvferry/transport.h"
#include "transport/ucx/sharded_transport.h"
#include "transport/ucx/transport_test_util.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {
namespace {

using namespace std::chrono_literals;
using testing::expected_image;
using testing::write_and_wait;

constexpr uint64_t kChildRegion = 32ull << 20;
constexpr uint8_t kFill = 0x5A;

// ---- pipe framing: u64 length + bytes -------------------------------------------------------

bool read_all(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_all(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = ::write(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool send_str(int fd, const std::string& s) {
  uint64_t n = s.size();
  return write_all(fd, &n, sizeof(n)) && write_all(fd, s.data(), s.size());
}

bool recv_str(int fd, std::string* s) {
  uint64_t n = 0;
  if (!read_all(fd, &n, sizeof(n)) || n > (1u << 20)) return false;
  s->resize(n);
  return read_all(fd, s->data(), n);
}

bool send_u64(int fd, uint64_t v) { return write_all(fd, &v, sizeof(v)); }
bool recv_u64(int fd, uint64_t* v) { return read_all(fd, v, sizeof(*v)); }

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// ---- child mode -------------------------------------------------------------------------------

// Child: creates a transport (KVFERRY_CHILD_SHARDS shards, default 1; KVFERRY_CHILD_NO_ACKS=1:
// tcp writes are placed but never acknowledged) and region, ships (address, rkey, base, bytes),
// then answers 'h' (hash of the region) until 'q' or EOF.
[[noreturn]] void child_main(const char* kind, int in, int out) {
  TransportOptions opt;
  opt.kind = std::strcmp(kind, "tcp") == 0 ? TransportKind::kTcp : TransportKind::kShm;
  const char* shards = std::getenv("KVFERRY_CHILD_SHARDS");
  if (shards != nullptr) opt.shards = static_cast<uint32_t>(std::atoi(shards));
  UcxTestHooks hooks;
  const char* no_acks = std::getenv("KVFERRY_CHILD_NO_ACKS");
  hooks.suppress_acks = no_acks != nullptr && std::strcmp(no_acks, "1") == 0;
  auto t = ShardedTransport::create(opt, hooks);
  if (!t.ok()) _exit(2);
  auto r = t.value()->create_region(kChildRegion);
  if (!r.ok()) _exit(3);
  std::memset(r->base, kFill, r->bytes);
  if (!send_str(out, t.value()->address()) || !send_str(out, r->packed_rkey) ||
      !send_u64(out, reinterpret_cast<uint64_t>(r->base)) || !send_u64(out, r->bytes)) {
    _exit(4);
  }
  char cmd = 0;
  while (read_all(in, &cmd, 1) && cmd != 'q') {
    if (cmd == 'h' && !send_u64(out, fnv1a(r->base, r->bytes))) _exit(5);
  }
  t.value().reset();
  _exit(0);
}

const int kChildHook = [] {
  const char* kind = std::getenv("KVFERRY_TRANSPORT_CHILD");
  if (kind != nullptr) {
    child_main(kind, std::atoi(std::getenv("KVFERRY_CHILD_IN")),
               std::atoi(std::getenv("KVFERRY_CHILD_OUT")));
  }
  return 0;
}();

// ---- parent side ------------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;
  RemoteRegionInfo info;

  ~Child() {
    if (to >= 0) ::close(to);
    if (from >= 0) ::close(from);
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  uint64_t hash() {
    uint64_t h = 0;
    char cmd = 'h';
    EXPECT_TRUE(write_all(to, &cmd, 1) && recv_u64(from, &h));
    return h;
  }
  int quit() {
    char cmd = 'q';
    write_all(to, &cmd, 1);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

std::unique_ptr<Child> spawn_child(TransportKind kind, uint32_t shards = 1, bool no_acks = false) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return nullptr;
  pid_t pid = fork();
  if (pid == 0) {
    ::close(down[1]);
    ::close(up[0]);
    setenv("KVFERRY_TRANSPORT_CHILD", std::string(transport_name(kind)).c_str(), 1);
    setenv("KVFERRY_CHILD_IN", std::to_string(down[0]).c_str(), 1);
    setenv("KVFERRY_CHILD_OUT", std::to_string(up[1]).c_str(), 1);
    setenv("KVFERRY_CHILD_SHARDS", std::to_string(shards).c_str(), 1);
    setenv("KVFERRY_CHILD_NO_ACKS", no_acks ? "1" : "0", 1);
    execl("/proc/self/exe", "ucx_process_test_child", static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(down[0]);
  ::close(up[1]);
  auto c = std::make_unique<Child>();
  c->pid = pid;
  c->to = down[1];
  c->from = up[0];
  RemoteSpan span;
  if (!recv_str(c->from, &c->info.worker_address) || !recv_str(c->from, &span.packed_rkey) ||
      !recv_u64(c->from, &span.base) || !recv_u64(c->from, &span.bytes)) {
    return nullptr;
  }
  c->info.spans = {span};
  return c;
}

class UcxProcessTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(UcxProcessTest, WritesLandInTheChildProcessRegion) {
  auto child = spawn_child(GetParam());
  ASSERT_NE(child, nullptr);
  ASSERT_EQ(child->info.spans.at(0).bytes, kChildRegion);
  TransportOptions opt;
  opt.kind = GetParam();
  auto t = make_ucx_transport(opt);
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto region = t.value()->create_region(16ull << 20);
  ASSERT_TRUE(region.ok());
  testing::fill_pattern(region->base, region->bytes);
  auto peer = t.value()->connect(child->info);
  ASSERT_TRUE(peer.ok()) << peer.status().message();
  std::vector<WriteOp> ops = {
      {0, 1, 1}, {4096, 1 << 20, 64 << 10}, {1 << 20, 9 << 20, 8 << 20}, {333, 20 << 20, 77777}};
  ASSERT_TRUE(write_and_wait(*t.value(), peer.value(), 1, ops).ok());
  std::vector<WriteOp> more = {{12 << 20, kChildRegion - (4 << 20), 4 << 20}};
  ASSERT_TRUE(write_and_wait(*t.value(), peer.value(), 2, more).ok());
  ops.insert(ops.end(), more.begin(), more.end());
  auto img = expected_image(kChildRegion, kFill, ops);
  EXPECT_EQ(child->hash(), fnv1a(img.data(), img.size()));
  // Out of the child's bounds: refused locally, the child's region is unchanged.
  EXPECT_EQ(write_and_wait(*t.value(), peer.value(), 3, {{0, kChildRegion - 1, 2}}).code(),
            ErrorCode::kProtocolError);
  EXPECT_EQ(child->hash(), fnv1a(img.data(), img.size()));
  t.value()->disconnect(peer.value());
  EXPECT_EQ(child->quit(), 0);
}

TEST_P(UcxProcessTest, KilledPeerIsReportedAndLaterWritesFail) {
  auto child = spawn_child(GetParam());
  ASSERT_NE(child, nullptr);
  TransportOptions opt;
  opt.kind = GetParam();
  auto t = make_ucx_transport(opt);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t.value()->create_region(1 << 20).ok());
  auto failed = std::make_shared<std::promise<Status>>();
  auto failed_f = failed->get_future();
  t.value()->set_peer_error_handler([failed, once = std::make_shared<std::once_flag>()](
                                        PeerId, Status st) {
    std::call_once(*once, [&] { failed->set_value(st); });
  });
  auto peer = t.value()->connect(child->info);
  ASSERT_TRUE(peer.ok()) << peer.status().message();
  ASSERT_TRUE(write_and_wait(*t.value(), peer.value(), 1, {{0, 0, 4096}}).ok());
  auto killed_at = std::chrono::steady_clock::now();
  kill(child->pid, SIGKILL);
  waitpid(child->pid, nullptr, 0);
  child->pid = -1;
  ASSERT_EQ(failed_f.wait_for(10s), std::future_status::ready) << "no peer error reported";
  auto detect_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::steady_clock::now() - killed_at).count();
  RecordProperty("detect_ms", static_cast<int>(detect_ms));
  EXPECT_EQ(failed_f.get().code(), ErrorCode::kPeerUnreachable);
  EXPECT_EQ(write_and_wait(*t.value(), peer.value(), 2, {{0, 0, 4096}}).code(),
            ErrorCode::kPeerUnreachable);
  EXPECT_EQ(t.value()->stats().peers, 0u);
  // Connecting to the dead peer again fails within the connect deadline instead of hanging.
  auto started = std::chrono::steady_clock::now();
  auto again = t.value()->connect(child->info);
  EXPECT_EQ(again.status().code(), ErrorCode::kPeerUnreachable) << again.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - started,
            UcxTransport::kConnectTimeout + std::chrono::seconds(1));
}

// A 2-shard writer and a 2-shard child: the child's death is reported once for the one peer id
// although both shards' endpoints see it; batches in flight on both shards fail (tcp: the child
// never acknowledges, so they are still in flight when it dies); later writes on both fail.
TEST_P(UcxProcessTest, ShardedKilledPeerIsReportedOnceAndFailsEveryShard) {
  const bool tcp = GetParam() == TransportKind::kTcp;
  auto child = spawn_child(GetParam(), /*shards=*/2, /*no_acks=*/tcp);
  ASSERT_NE(child, nullptr);
  TransportOptions opt;
  opt.kind = GetParam();
  opt.shards = 2;
  auto t = make_ucx_transport(opt);
  ASSERT_TRUE(t.ok()) << t.status().str();
  ASSERT_TRUE(t.value()->create_region(1 << 20).ok());
  auto reports = std::make_shared<std::atomic<int>>(0);
  auto failed = std::make_shared<std::promise<std::pair<PeerId, Status>>>();
  auto failed_f = failed->get_future();
  t.value()->set_peer_error_handler([failed, reports](PeerId id, Status st) {
    if (reports->fetch_add(1) == 0) failed->set_value({id, st});
  });
  auto peer = t.value()->connect(child->info);
  ASSERT_TRUE(peer.ok()) << peer.status().str();
  ASSERT_EQ(ShardedTransport::shard_of(10, 2), 0u);
  ASSERT_EQ(ShardedTransport::shard_of(11, 2), 1u);
  std::vector<testing::Completion> in_flight(2);
  if (tcp) {
    t.value()->write(peer.value(), 10, {{0, 0, 4096}}, in_flight[0].callback());
    t.value()->write(peer.value(), 11, {{4096, 4096, 4096}}, in_flight[1].callback());
  } else {
    ASSERT_TRUE(write_and_wait(*t.value(), peer.value(), 10, {{0, 0, 4096}}).ok());
    ASSERT_TRUE(write_and_wait(*t.value(), peer.value(), 11, {{0, 4096, 4096}}).ok());
  }
  kill(child->pid, SIGKILL);
  waitpid(child->pid, nullptr, 0);
  child->pid = -1;
  ASSERT_EQ(failed_f.wait_for(10s), std::future_status::ready) << "no peer error reported";
  auto [id, st] = failed_f.get();
  EXPECT_EQ(id, peer.value());
  EXPECT_EQ(st.code(), ErrorCode::kPeerUnreachable);
  if (tcp) {
    for (auto& c : in_flight) EXPECT_FALSE(c.wait().ok());
  }
  // A write on each shard, queued after the other shard's endpoint close: once both completed,
  // every report a shard could still make has been made.
  EXPECT_EQ(write_and_wait(*t.value(), peer.value(), 10, {{0, 0, 4096}}).code(),
            ErrorCode::kPeerUnreachable);
  EXPECT_EQ(write_and_wait(*t.value(), peer.value(), 11, {{0, 0, 4096}}).code(),
            ErrorCode::kPeerUnreachable);
  EXPECT_EQ(reports->load(), 1);
  EXPECT_EQ(t.value()->stats().peers, 0u);
  t.value()->disconnect(peer.value());
}

INSTANTIATE_TEST_SUITE_P(Kinds, UcxProcessTest,
                         ::testing::Values(TransportKind::kShm, TransportKind::kTcp),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

}  // namespace
}  // namespace kvferry::ucx
