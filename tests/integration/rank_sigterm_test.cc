// A real `kvferry rank` process keeps every JSON log line when it is stopped by SIGTERM: its debug
// lines are in the file while it runs (a naive logger flushing only at warning holds them in its
// buffer, and SIGTERM's default action loses them), and the termination itself is logged, flushed,
// and still ends the process by SIGTERM.
#include <signal.h>

#include "replay_harness.h"

namespace kvferry_itest {
namespace {

TEST(RankSigterm, DebugLinesAndTheStopReachTheLogFile) {
  const fs::path dir = fs::temp_directory_path() / ("kvferry_sigterm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path log = dir / "rank.jsonl", output = dir / "rank.out";
  // A prefill rank whose bootstrap service does not exist: it logs its pool (debug), then retries
  // its registration for up to 30 s, until the SIGTERM.
  std::vector<std::string> args = {"rank", "--role", "prefill", "--tp-rank", "0", "--tp-size", "1",
                                   "--pool-mib", "16", "--bootstrap", "127.0.0.1:1", "--engine-endpoint",
                                   "tcp://127.0.0.1:1", "--router-endpoint", "tcp://127.0.0.1:1",
                                   "--lookup-timeout-ms", "30000", "--log-file", log.string()};
  const pid_t pid = start_cli(args, output);
  ASSERT_GT(pid, 0);

  // The debug line about the pool is in the file while the rank still runs.
  bool pool_line = false;
  for (int i = 0; i < 200 && !pool_line; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pool_line = slurp(log).find("\"pool: ") != std::string::npos;
  }
  EXPECT_TRUE(pool_line) << slurp(output);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "the rank ended early: " << slurp(output);

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  const std::string text = slurp(log);
  EXPECT_NE(text.find("\"pool: "), std::string::npos);
  EXPECT_NE(text.find("stopped by Terminated"), std::string::npos) << text;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvferry_itest
