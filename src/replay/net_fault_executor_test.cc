// Network faults (net_fault_executor.h): commands, link lists, the partition ruleset, and both
// faults carried out in a network namespace of this test's own (prefix kvn, unique per process).
#include "replay/net_fault_executor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

namespace kvferry::replay {
namespace {

TEST(NetFaults, CommandsRunThroughTheHostsExecPrefix) {
  NetHost h{"h", "10.72.0.2", {"ip", "netns", "exec", "kvn1"}, {}};
  EXPECT_EQ(on_host(h, {"nft", "-f", "x"}), (std::vector<std::string>{"ip", "netns", "exec", "kvn1", "nft", "-f", "x"}));
  EXPECT_EQ(on_host(NetHost{}, {"true"}), (std::vector<std::string>{"true"}));
}

TEST(NetFaults, LinksAreTheNonLoopbackOnes) {
  auto l = parse_links(R"([{"ifindex":1,"ifname":"lo","link_type":"loopback"},
                           {"ifindex":2,"ifname":"veth0","link_type":"ether"},
                           {"ifindex":3,"ifname":"eth1@if9","link_type":"ether"}])");
  ASSERT_TRUE(l.ok()) << l.status().str();
  EXPECT_EQ(*l, (std::vector<std::string>{"veth0", "eth1@if9"}));
  EXPECT_FALSE(parse_links("{}").ok());
  EXPECT_FALSE(parse_links("[{\"ifindex\":1}]").ok());
}

TEST(NetFaults, PartitionDropsEverythingButLoopback) {
  const std::string r = partition_ruleset();
  EXPECT_NE(r.find("table inet kvferry_partition"), std::string::npos);
  EXPECT_NE(r.find("hook input priority -300; policy drop; iif \"lo\" accept;"), std::string::npos) << r;
  EXPECT_NE(r.find("hook output priority -300; policy drop; oif \"lo\" accept;"), std::string::npos) << r;
  EXPECT_EQ(r.find("reject"), std::string::npos);  // silent: dropped, never refused
}

TEST(NetFaults, RunCommandReportsOutputFailuresAndTimeouts) {
  auto ok = run_command({"echo", "hello"});
  ASSERT_TRUE(ok.ok()) << ok.status().str();
  EXPECT_EQ(*ok, "hello\n");
  auto bad = run_command({"sh", "-c", "echo nope; exit 3"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("nope"), std::string::npos);
  EXPECT_FALSE(run_command({"/nonexistent/kvferry-none"}).ok());
  auto slow = run_command({"sleep", "5"}, 100);
  ASSERT_FALSE(slow.ok());
  EXPECT_NE(slow.status().message().find("did not finish"), std::string::npos);
}

// A namespace of this test's own with a veth pair: both faults applied and healed.
class NetNs : public ::testing::Test {
 protected:
  void SetUp() override {
    ns_ = "kvn-ut" + std::to_string(::getpid());
    if (!run_command({"ip", "netns", "add", ns_}).ok()) {
      const char* no = std::getenv("KVFERRY_NO_NETNS");
      if (no && std::string(no) == "1") GTEST_SKIP() << "cannot create network namespaces (KVFERRY_NO_NETNS=1)";
      FAIL() << "cannot create a network namespace (needs root; set KVFERRY_NO_NETNS=1 to skip)";
    }
    made_ = true;
    host_.exec = {"ip", "netns", "exec", ns_};
    // A veth pair inside the namespace: two non-loopback links of its own.
    auto made = run_command(on_host(host_, {"ip", "link", "add", "kvd0", "type", "veth", "peer", "name", "kvd1"}));
    ASSERT_TRUE(made.ok()) << made.status().str();
    ASSERT_TRUE(run_command(on_host(host_, {"ip", "link", "set", "dev", "kvd0", "up"})).ok());
    ASSERT_TRUE(run_command(on_host(host_, {"ip", "link", "set", "dev", "kvd1", "up"})).ok());
  }
  void TearDown() override {
    if (made_) (void)run_command({"ip", "netns", "delete", ns_});
  }
  std::string link_state(const std::string& link) {
    auto s = run_command(on_host(host_, {"ip", "-j", "link", "show", "dev", link}));
    return s.ok() && s->find("\"UP\"") != std::string::npos ? "up" : "down";
  }
  std::string ns_;
  bool made_ = false;
  NetHost host_;
};

TEST_F(NetNs, LinkDownAndPartitionAreAppliedAndHealed) {
  std::ostringstream out;
  NetFaultExecutor ex({{"link_down", "h", 50, 2}, {"partition", "h", 50, 4}}, {{"h", host_}}, ::testing::TempDir(),
                      out);
  ASSERT_TRUE(ex.poll(1, 1'000'000'000).ok());
  EXPECT_EQ(ex.records()[0].start_ns, 0);  // not due yet
  ASSERT_TRUE(ex.poll(2, 1'000'000'000).ok());
  ASSERT_EQ(ex.records()[0].links, (std::vector<std::string>{"kvd1", "kvd0"}));
  EXPECT_EQ(link_state("kvd0"), "down");
  EXPECT_EQ(link_state("kvd1"), "down");
  ASSERT_TRUE(ex.poll(4, 1'010'000'000).ok());
  auto tables = run_command(on_host(host_, {"nft", "list", "tables"}));
  ASSERT_TRUE(tables.ok()) << tables.status().str();
  EXPECT_NE(tables->find("kvferry_partition"), std::string::npos) << *tables;
  ASSERT_TRUE(ex.poll(4, 1'060'000'000).ok());  // 50 ms passed: the link is back
  EXPECT_EQ(ex.records()[0].end_ns, 1'060'000'000);
  EXPECT_EQ(link_state("kvd0"), "up");
  EXPECT_EQ(link_state("kvd1"), "up");
  ex.heal_all();  // the partition is healed too
  tables = run_command(on_host(host_, {"nft", "list", "tables"}));
  ASSERT_TRUE(tables.ok());
  EXPECT_EQ(tables->find("kvferry_partition"), std::string::npos) << *tables;
  EXPECT_NE(out.str().find("partition of h for 50 ms"), std::string::npos) << out.str();
}

}  // namespace
}  // namespace kvferry::replay
