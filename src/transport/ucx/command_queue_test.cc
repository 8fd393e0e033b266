#include "transport/ucx/command_queue.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kvferry::ucx {
namespace {

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

TEST(CommandQueueTest, RunsPostedClosuresInOrderAndSignalsTheFd) {
  CommandQueue q;
  ASSERT_TRUE(q.valid());
  EXPECT_FALSE(readable(q.fd()));
  std::vector<int> seen;
  EXPECT_TRUE(q.post([&] { seen.push_back(1); }));
  EXPECT_TRUE(q.post([&] { seen.push_back(2); }));
  EXPECT_TRUE(readable(q.fd()));
  EXPECT_FALSE(q.empty());
  EXPECT_EQ(q.run_pending(), 2u);
  EXPECT_EQ(seen, (std::vector<int>{1, 2}));
  EXPECT_FALSE(readable(q.fd()));
  EXPECT_TRUE(q.empty());
}

TEST(CommandQueueTest, ClosureThatPostsRunsOnTheNextRound) {
  CommandQueue q;
  int n = 0;
  q.post([&] { q.post([&] { ++n; }); });
  EXPECT_EQ(q.run_pending(), 1u);
  EXPECT_EQ(n, 0);
  EXPECT_TRUE(readable(q.fd()));  // the nested post woke us again
  EXPECT_EQ(q.run_pending(), 1u);
  EXPECT_EQ(n, 1);
}

TEST(CommandQueueTest, CloseRejectsLaterPostsButKeepsQueuedOnes) {
  CommandQueue q;
  int n = 0;
  q.post([&] { ++n; });
  q.close();
  EXPECT_FALSE(q.post([&] { n += 10; }));
  EXPECT_EQ(q.run_pending(), 1u);
  EXPECT_EQ(n, 1);
}

TEST(CommandQueueTest, ManyProducersLoseNothing) {
  CommandQueue q;
  std::atomic<int> n{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < 4; ++t) {
    producers.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) q.post([&] { n++; });
    });
  }
  for (auto& p : producers) p.join();
  q.run_pending();
  EXPECT_EQ(n.load(), 4000);
}

}  // namespace
}  // namespace kvferry::ucx
