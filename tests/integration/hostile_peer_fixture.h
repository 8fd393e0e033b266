// The fixture of the hostile-peer suite (hostile_peer_test.cc, hostile_peer_restart_test.cc;
// docs/security.md, "Tests"): the attacked cluster (hostile_peer_harness.h) started with or
// without the cluster secret, honest rooms that must survive every case, and the liar's sends.
#pragma once
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "hostile_peer_harness.h"

extern char** environ;

namespace kvferry_itest {

inline const std::string kSecret = "hostile peer test cluster secret 0123456789";
// The prefill rank's frame limit (EndpointCore: ZMQ_MAXMSGSIZE derived from its pool's pages).
inline const uint64_t kFrameCap = static_cast<uint64_t>(ControlLimits::frame_bytes_for_pages(kPages));

// A room of the honest pair started (metadata exchanged, the sender ready) but not written yet:
// it is live while a case runs and must still succeed afterwards.
struct HonestRoom {
  uint64_t id = 0;
  std::vector<uint64_t> src, dst;
  std::unique_ptr<Sender> tx;
  std::unique_ptr<Receiver> rx;
};

class HostilePeer : public ::testing::TestWithParam<bool> {
 protected:
  bool secret() const { return GetParam(); }

  // Sets the secret (or none) for this process and starts the cluster. False: this process had
  // read the other setting already (several tests in one run), so the test ran alone in a child
  // process and its result is asserted here.
  bool enter() {
    dir_ = "/tmp/kvferry-hostile-" + std::to_string(::getpid());
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
    Status s = c_.start();
    if (!s.ok()) {
      ADD_FAILURE() << "the attacked cluster did not start: " << s.str();
      return false;
    }
    liar().incarnation = 7;
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
  const std::string& pctl() { return pctl_ = c_.prefill->control_endpoint(); }
  const std::string& dctl() { return dctl_ = c_.decode->control_endpoint(); }

  // Sends a liar frame; without the secret it retries (pumping) until ZeroMQ queued it. With the
  // secret the liar's socket cannot complete a handshake, so one attempt is all it gets.
  void liar_send(const std::string& to, const std::string& frame) {
    for (auto end = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < end;) {
      if (liar().send_raw(to, frame).ok() || secret()) return;
      c_.pump();
    }
    ADD_FAILURE() << "the liar's frame was never queued";
  }
  void liar_send(const std::string& to, Message m) {
    std::visit([&](auto& x) { if (x.incarnation == 0) x.incarnation = liar().incarnation; }, m);
    liar_send(to, encode(m));
  }
  // Registers the liar's (possibly lying) pool; its heartbeat keeps going from then on.
  void liar_register(const PoolRegistration& r) {
    liar_send(pctl(), Message{r});
    c_.liar_registered = !secret();
  }

  HonestRoom start_honest(uint64_t id) {
    HonestRoom h;
    h.id = id;
    h.src = {id % 5, 5 + id % 3, 9};
    h.dst = {(id / 2) % 4, 6, 11 + id % 4};
    for (size_t b = 0; b < 4; ++b)
      for (uint64_t p : h.src) std::memset(c_.pmem.kv_page(b, p), static_cast<int>(id * 3 + b + p), kPageBytes);
    h.rx = c_.decode->receiver(id).value();
    h.tx = c_.prefill->sender(id).value();
    EXPECT_TRUE(h.rx->init().ok());
    EXPECT_TRUE(h.rx->send_metadata(h.dst, id % kAuxRows, {}).ok());
    EXPECT_TRUE(h.tx->init(kRoomPages, 1).ok());
    EXPECT_TRUE(c_.pump_until([&] { return h.tx->poll() != KVPoll::Bootstrapping; }));
    EXPECT_EQ(h.tx->poll(), KVPoll::WaitingForInput) << Cluster::fmt_room(h.tx, h.rx);
    return h;
  }
  void finish_honest(HonestRoom& h) {
    SCOPED_TRACE("honest room " + std::to_string(h.id));
    ASSERT_EQ(h.tx->poll(), KVPoll::WaitingForInput) << Cluster::fmt_room(h.tx, h.rx);
    ASSERT_EQ(h.rx->poll(), KVPoll::WaitingForInput) << Cluster::fmt_room(h.tx, h.rx);
    ASSERT_TRUE(h.tx->send(h.src, {}, true).ok());
    ASSERT_TRUE(c_.pump_until([&] { return h.tx->poll() == KVPoll::Success && h.rx->poll() == KVPoll::Success; }))
        << Cluster::fmt_room(h.tx, h.rx);
    for (size_t b = 0; b < 4; ++b)
      for (size_t i = 0; i < h.src.size(); ++i)
        EXPECT_EQ(std::memcmp(c_.pmem.kv_page(b, h.src[i]), c_.dmem.kv_page(b, h.dst[i]), kPageBytes), 0)
            << "buffer " << b << " page " << h.dst[i];
    EXPECT_TRUE(c_.pump_until([&] { return h.tx->release_safe() && h.rx->release_safe(); }));
  }

  // What must hold after every case.
  void expect_unharmed(HonestRoom& bystander) {
    finish_honest(bystander);
    HonestRoom fresh = start_honest(bystander.id + 100);
    finish_honest(fresh);
    EXPECT_EQ(c_.pmem.damaged_canary(), 0u) << "prefill canary bytes changed";
    EXPECT_EQ(c_.dmem.damaged_canary(), 0u) << "decode canary bytes changed";
    if (secret()) {
      // Give a frame every chance to arrive (past the control socket's 1 s first-contact window).
      c_.pump_for(1500ms);
      EXPECT_EQ(c_.liar_frames_at_prefill, 0u) << "a frame of the liar was parsed by the prefill rank";
      EXPECT_EQ(c_.liar_frames_at_decode, 0u) << "a frame of the liar was parsed by the decode rank";
      EXPECT_EQ(logs_.count("rejected control frame"), 0u) << logs_.matching("rejected control frame");
      EXPECT_EQ(c_.pe().refused_registrations(), 0u);
      EXPECT_EQ(c_.pcore().incarnation_counts().stale_total() + c_.dcore().incarnation_counts().stale_total(), 0u);
      EXPECT_EQ(c_.prefill->stats().peers, 1u);
      EXPECT_TRUE(liar().received.empty()) << "an attacked rank answered the liar";
    }
  }

  // A liar room (odd id: decode DP group 1, the liar's): the prefill's sender for it.
  std::unique_ptr<Sender> liar_room(uint64_t id, const std::vector<uint64_t>& pages) {
    auto tx = c_.prefill->sender(id).value();
    EXPECT_TRUE(tx->init(pages.size(), 2).ok());
    RoomMetadata md{id, liar().self, pages, 0, {}, 1};
    liar_send(pctl(), Message{md});
    return tx;
  }

  LogCapture logs_;
  Cluster c_;
  std::string dir_, pctl_, dctl_;
};

#define HOSTILE_START() \
  if (!enter()) return

}  // namespace kvferry_itest
