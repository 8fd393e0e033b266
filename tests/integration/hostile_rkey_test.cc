// Issue 31, item 1 (the blocker): garbage remote keys and the prefill's OWN worker address reach
// a prefill rank over shm. The attacked cluster of hostile_peer_harness.h (a real prefill and a
// real decode rank, engine buffers between canary bytes) runs the shm transport here; the liar
// (decode DP group 1, a rank of the plan) registers pools whose worker address is the prefill's
// own (as published in its bootstrap entry) or the honest decode rank's, with 64 random bytes or
// 1-3 byte mutations of the honest decode rank's real packed rkey. Before the fix, UCX 1.13's
// ucp_ep_rkey_unpack segfaulted on such keys in its own cleanup (ucp_rkey.c:
// ucp_ep_rkey_unpack_internal -> ucp_rkey_destroy -> uct_rkey_release) and took the rank, and
// with it this test process, down. Now every lie is refused before UCX sees it (registration
// refused, or its connect fails with the refusal), and the rank stays alive and keeps serving:
// honest rooms complete byte-exact afterwards and no canary byte changed. Runs without and with
// the cluster secret (with it, no frame of the liar is parsed at all).
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "hostile_peer_harness.h"

extern char** environ;

namespace kvferry_itest {
namespace {

const std::string kSecret = "hostile rkey test cluster secret 0123456789";

class HostileRkey : public ::testing::TestWithParam<bool> {
 protected:
  bool secret() const { return GetParam(); }

  // As HostilePeer::enter (hostile_peer_test.cc): the secret (or none) for this process, or the
  // test alone in a child process when this process read the other setting already.
  bool enter() {
    dir_ = "/tmp/kvferry-hostile-rkey-" + std::to_string(::getpid());
    ::mkdir(dir_.c_str(), 0700);
    if (secret()) {
      const std::string file = dir_ + "/cluster.secret";
      std::ofstream(file) << kSecret << "\n";
      ::chmod(file.c_str(), 0600);
      ::setenv(security::kSecretFileEnv, file.c_str(), 1);
    } else {
      ::unsetenv(security::kSecretFileEnv);
      ::unsetenv(security::kSecretEnv);
    }
    auto keys = security::cluster_keys();
    if (!keys.ok()) {
      ADD_FAILURE() << keys.status().str();
      return false;
    }
    if ((*keys != nullptr) != secret()) {
      run_alone_in_child();
      return false;
    }
    c_.transport = "shm";
    Status s = c_.start();
    if (!s.ok()) {
      ADD_FAILURE() << "the attacked cluster did not start: " << s.str();
      return false;
    }
    return true;
  }

  void run_alone_in_child() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string filter = std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
    const std::string out = dir_ + "/child.txt";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::string self = "/proc/self/exe";
    char* argv[] = {self.data(), const_cast<char*>(filter.c_str()), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, self.c_str(), &fa, nullptr, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    std::stringstream text;
    text << std::ifstream(out).rdbuf();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child run of " << filter << ":\n" << text.str();
  }

  Liar& liar() { return *c_.liar; }

  // Every way the prefill rank turns a registration down (refused, or its connect failed).
  uint64_t turned_down() {
    return c_.pe().refused_registrations() + logs_.count("cannot connect to decode peer " + liar().self.str());
  }

  // One lie: sent (without the secret: until ZeroMQ queued it) and, without the secret, turned
  // down before the next. The liar's incarnation moves on (still < kLiarIncarnationLimit), so
  // each lie is a registration of its own and none is stale.
  void lie(PoolRegistration r, const std::string& what) {
    SCOPED_TRACE(what);
    r.incarnation = ++liar().incarnation;
    const uint64_t before = turned_down();
    const std::string frame = encode(Message{r});
    bool queued = false;
    for (auto end = std::chrono::steady_clock::now() + 60s; !queued && std::chrono::steady_clock::now() < end;) {
      queued = liar().send_raw(c_.prefill->control_endpoint(), frame).ok();
      if (secret()) return;  // one attempt: the handshake cannot complete without the keys
      if (!queued) c_.pump();
    }
    ASSERT_TRUE(queued) << "the liar's frame was never queued";
    c_.liar_registered = true;
    ASSERT_TRUE(c_.pump_until([&] { return turned_down() > before; })) << "neither refused nor failed to connect";
    EXPECT_EQ(c_.prefill->stats().peers, 1u) << "the liar's pool was connected";
  }

  // The rank is alive and serves: honest rooms complete byte-exact, canaries intact.
  void expect_serving(uint64_t room) {
    EXPECT_EQ(c_.honest_room(room), "");
    EXPECT_EQ(c_.honest_room(room + 2), "");
    EXPECT_EQ(c_.pmem.damaged_canary(), 0u) << "prefill canary bytes changed";
    EXPECT_EQ(c_.dmem.damaged_canary(), 0u) << "decode canary bytes changed";
    if (secret()) {
      c_.pump_for(1500ms);
      EXPECT_EQ(c_.liar_frames_at_prefill, 0u) << "a frame of the liar was parsed by the prefill rank";
      EXPECT_EQ(c_.pe().refused_registrations(), 0u);
    }
  }

  std::string prefill_worker_address() { return c_.pcore().transport().address(); }

  LogCapture logs_;
  Cluster c_;
  std::string dir_;
};

// The frame: a valid shape, the prefill's own worker address, 64 random bytes as the
// packed rkey (offline about half of these crashed UCX's unpack); then the same address with the
// prefill's real-looking key (the honest decode rank's) and with no change at all but the address.
TEST_P(HostileRkey, OwnWorkerAddressWithGarbageKeyIsRefusedAndTheRankServes) {
  if (!enter()) return;
  std::mt19937 rng(31);
  for (int i = 0; i < 8; ++i) {
    PoolRegistration r = liar_registration(*c_.honest_registration, liar(), kPages);
    r.worker_address = prefill_worker_address();
    r.spans[0].packed_rkey.resize(64);
    for (char& ch : r.spans[0].packed_rkey) ch = static_cast<char>(rng());
    lie(r, "own address, random key " + std::to_string(i));
  }
  PoolRegistration r = liar_registration(*c_.honest_registration, liar(), kPages);
  r.worker_address = prefill_worker_address();
  r.spans = c_.honest_registration->spans;
  lie(r, "own address, the honest decode rank's key");
  if (!secret()) {
    EXPECT_GE(logs_.count("peer worker address is this rank's own"), 1u) << logs_.matching("cannot connect");
  }
  expect_serving(40);
}

// Garbage keys with a reachable peer address (the honest decode rank's): 64 random bytes, and
// 1-3 byte mutations of its real packed rkey (offline 10% of these crashed UCX's unpack).
TEST_P(HostileRkey, RandomAndMutatedKeysAreRefusedAndTheRankServes) {
  if (!enter()) return;
  std::mt19937 rng(7);
  const std::string real = c_.honest_registration->spans.at(0).packed_rkey;
  for (int i = 0; i < 24; ++i) {
    PoolRegistration r = liar_registration(*c_.honest_registration, liar(), kPages);
    r.worker_address = c_.honest_registration->worker_address;
    r.spans = c_.honest_registration->spans;
    std::string& key = r.spans[0].packed_rkey;
    if (i < 8) {
      key.resize(64);
      for (char& ch : key) ch = static_cast<char>(rng());
    } else {
      key = real;
      for (int n = 1 + i % 3; n > 0; --n) key[rng() % key.size()] = static_cast<char>(rng());
      if (key == real) key[0] = static_cast<char>(key[0] ^ 0x40);  // an md this rank has not
    }
    lie(r, "key " + std::to_string(i));
  }
  expect_serving(50);
}

INSTANTIATE_TEST_SUITE_P(Secret, HostileRkey, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "with_secret" : "without_secret"; });

}  // namespace
}  // namespace kvferry_itest
