// The lease renewal through the public Manager (kvferry/manager.h; docs/manager.md "Renewal"):
// vLLM's order, prefill's sender opened and init()ed first, decode's receiver init()ed while its
// request waits for blocks (no metadata). The decode rank renews the room at its source every
// renew_interval, so the room outlives the source's bootstrap deadline (its lease) and then
// succeeds with every byte right; renewals never carry it past renew_limit, where it fails
// (bootstrap_timeout, origin the prefill rank, one line above debug there).
// Without the renewal both tests fail: the room fails at its first bootstrap deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "kvferry/log.h"
#include "manager/manager_pair_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using namespace kvferry::testing;

struct LineLog {
  std::mutex mu;
  std::vector<std::pair<std::string, LogFields>> lines;  // above debug: component, fields
  LineLog() {
    set_log_callback([this](LogLevel level, std::string_view comp, std::string_view, const LogFields& f) {
      if (level <= LogLevel::kDebug) return;
      std::lock_guard lk(mu);
      lines.emplace_back(std::string(comp), f);
    });
  }
  ~LineLog() { set_log_callback({}); }
  size_t of_room(uint64_t room) {
    std::lock_guard lk(mu);
    size_t n = 0;
    for (const auto& [c, f] : lines) n += f.room == room;
    return n;
  }
};

const std::string kPrefillLog = "kvferry.prefill";

void log_prefill_failures(ManagerConfig& c) {
  if (c.self.role == Role::kPrefill) c.failure_log_component = kPrefillLog;
}

TEST(ManagerLease, RenewedRoomOutlivesTheLeaseAndSucceedsWithEveryByte) {
  Deadlines d;
  d.bootstrap_timeout_ms = 1000;  // the lease
  d.renew_interval_ms = 100;
  auto r = make_ranks("shm", false, d, log_prefill_failures);
  ASSERT_TRUE(r);
  const uint64_t room = 0x1ea5e;
  const std::vector<uint64_t> src{3, 1, 4, 0}, dst{9, 5, 12, 7};
  auto tx = r->prefill->sender(room).value();
  ASSERT_TRUE(tx->init(src.size(), 0, 60).ok());  // the lease starts here
  const auto opened = std::chrono::steady_clock::now();
  auto rx = r->decode->receiver(room).value();
  ASSERT_TRUE(rx->init(-1).ok());  // the request waits for blocks: no metadata
  // Two and a half leases pass: the room is still waiting for decode's metadata, not failed.
  const auto past = opened + 2500ms;
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed || std::chrono::steady_clock::now() > past; }, 30s));
  ASSERT_EQ(tx->poll(), KVPoll::Bootstrapping) << (tx->failure() ? tx->failure()->failure_reason : "");
  EXPECT_EQ(rx->poll(), KVPoll::Bootstrapping);
  // Blocks are free now: the metadata goes out and the room is written.
  ASSERT_TRUE(rx->send_metadata(dst, 11, {}, 60).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  fill(*r->prefill, room, 0, src);
  ASSERT_TRUE(tx->send(src, {}, true).ok());
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Success && tx->poll() == KVPoll::Success; }))
      << "prefill " << to_string(tx->poll()) << ", decode " << to_string(rx->poll());
  EXPECT_EQ(mismatched(*r->decode, room, dst), 0u);
  EXPECT_FALSE(tx->failure());
  EXPECT_FALSE(rx->failure());
}

TEST(ManagerLease, RenewalsEndAtTheRenewLimit) {
  LineLog log;
  Deadlines d;
  d.bootstrap_timeout_ms = 600;  // 12 renewals a lease: a stalled step does not end it early
  d.renew_interval_ms = 50;
  d.renew_limit_ms = 2400;
  auto r = make_ranks("shm", false, d, log_prefill_failures);
  ASSERT_TRUE(r);
  const uint64_t room = 0x1ea5f;
  auto tx = r->prefill->sender(room).value();
  const int64_t opened_ns = monotonic_ns();
  ASSERT_TRUE(tx->init(4, 0, 60).ok());
  auto rx = r->decode->receiver(room).value();
  ASSERT_TRUE(rx->init(-1).ok());  // renews, and never sends metadata
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed; }, 30s)) << to_string(tx->poll());
  auto e = tx->failure();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::kBootstrapTimeout);
  EXPECT_EQ(e->origin, r->prefill->self());
  EXPECT_FALSE(e->is_from_another_rank);
  EXPECT_NE(e->failure_reason.find("renewals end 2400 ms after the room's opening"), std::string::npos)
      << e->failure_reason;
  EXPECT_GE(e->first_seen_ns - opened_ns, 2400'000'000) << "failed before the renew limit";
  // Decode is told: its waiting request takes the engine's policy with prefill's record.
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Failed; }));
  ASSERT_TRUE(rx->failure());
  EXPECT_EQ(rx->failure()->code, ErrorCode::kBootstrapTimeout);
  EXPECT_EQ(rx->failure()->origin, r->prefill->self());
  EXPECT_TRUE(rx->release_safe()) << "no metadata went out: nothing can be written";
  // One line above debug for the room, at prefill (its origin).
  ASSERT_TRUE(r->until([&] { return tx->release_safe() && log.of_room(room) >= 1; }));
  std::lock_guard lk(log.mu);
  std::vector<std::string> comps;
  for (const auto& [c, f] : log.lines)
    if (f.room == room) comps.push_back(c + " " + f.origin + " " + f.code);
  EXPECT_EQ(comps, std::vector<std::string>{kPrefillLog + " prefill/tp0 bootstrap_timeout"});
}

}  // namespace
}  // namespace kvferry
