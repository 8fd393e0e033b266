#include "kvferry/deadlines.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace kvferry {
namespace {

TEST(Deadlines, EnvironmentOverridesDefaultsAndBadValuesAreNamed) {
  setenv("KVFERRY_BOOTSTRAP_TIMEOUT_MS", "1234", 1);
  setenv("KVFERRY_WAITING_TIMEOUT_MS", "soon", 1);
  std::vector<std::string> bad;
  Deadlines d = deadlines_from_env(&bad);
  unsetenv("KVFERRY_BOOTSTRAP_TIMEOUT_MS");
  unsetenv("KVFERRY_WAITING_TIMEOUT_MS");
  EXPECT_EQ(d.bootstrap_timeout_ms, 1234);
  EXPECT_EQ(d.waiting_timeout_ms, 300000);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0], "KVFERRY_WAITING_TIMEOUT_MS=soon");
}

TEST(Deadlines, ArgsCarryEveryField) {
  Deadlines d;
  d.heartbeat_timeout_ms = 777;
  auto args = deadline_args(d);
  ASSERT_EQ(args.size(), deadline_fields().size() * 2);
  bool found = false;
  for (size_t i = 0; i + 1 < args.size(); i += 2)
    if (args[i] == "--heartbeat-timeout-ms") found = args[i + 1] == "777";
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace kvferry
