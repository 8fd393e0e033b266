#include "replay/child_args.h"

#include <gtest/gtest.h>

#include <tuple>

namespace kvferry::replay {
namespace {

// A command line as one string, arguments separated by one space.
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

TEST(ChildArgs, RankRouterBootstrap) {
  ReplayConfig c;
  c.exe = "/x/kvferry";
  c.trace = "/t.csv";
  c.models_file = "/m.json";
  c.model = "Qwen2.5-7B";
  c.prefill_tp = 2;
  c.decode_tp = 2;
  c.page_size = 16;
  c.pool_mib = 256;
  c.prefill_pool_mib = 64;
  c.chunk_tokens = 4096;
  c.transport = "tcp";
  c.out = "/o";
  c.time_scale = 0.5;
  c.fault_rate = 0.2;
  Ports p{.bootstrap = 1001, .router = 1004, .prefill_engines = {1002}, .decode_engines = {1003}};
  c.deadlines.waiting_timeout_ms = 1234;
  EXPECT_EQ(join(rank_args(c, p, false, 1)),
            "/x/kvferry rank --role decode --tp-rank 1 --tp-size 2 --peer-tp-size 2 "
            "--model Qwen2.5-7B "
            "--models-file /m.json --page-size 16 --pool-mib 256 --bootstrap 127.0.0.1:1001 "
            "--engine-endpoint tcp://127.0.0.1:1003 --router-endpoint tcp://127.0.0.1:1004 "
            "--transport tcp --log-file /o/logs/decode-tp1.jsonl --chunk-tokens 4096 " +
                [] {
                  Deadlines d;
                  d.waiting_timeout_ms = 1234;
                  std::string s;
                  for (const auto& a : deadline_args(d)) s += (s.empty() ? "" : " ") + a;
                  return s;
                }());
  EXPECT_NE(join(rank_args(c, p, true, 0)).find("--waiting-timeout-ms 1234 "), std::string::npos);
  c.transfer_shards = 3;  // to every rank of both engines
  for (bool prefill : {true, false}) {
    for (uint32_t tp : {0u, 1u}) {
      EXPECT_NE(join(rank_args(c, p, prefill, tp)).find(" --transfer-shards 3 "), std::string::npos)
          << prefill << " " << tp;
    }
  }
  c.transfer_shards = 1;
  // The compute model goes to the prefill ranks only.
  EXPECT_EQ(join(rank_args(c, p, true, 0)).find("--prefill-ms-per-layer"), std::string::npos);
  c.prefill_ms_per_layer = 2.5;
  c.layerwise = true;
  EXPECT_NE(join(rank_args(c, p, true, 1)).find(" --prefill-ms-per-layer 2.5 --layerwise"), std::string::npos);
  EXPECT_EQ(join(rank_args(c, p, false, 1)).find("--prefill-ms-per-layer"), std::string::npos);
  EXPECT_EQ(join(rank_args(c, p, false, 1)).find("--layerwise"), std::string::npos);
  c.prefill_ms_per_layer = 0;
  c.layerwise = false;
  c.break_rank = "decode/tp1";
  EXPECT_NE(join(rank_args(c, p, false, 1)).find("--page-size 0 "), std::string::npos);
  EXPECT_NE(join(rank_args(c, p, false, 0)).find("--page-size 16 "), std::string::npos);
  c.break_rank.clear();
  const std::string prefill = join(rank_args(c, p, true, 0));
  EXPECT_NE(prefill.find("--role prefill --tp-rank 0"), std::string::npos);
  EXPECT_NE(prefill.find("--pool-mib 64 "), std::string::npos);
  EXPECT_NE(prefill.find("--engine-endpoint tcp://127.0.0.1:1002"), std::string::npos);
  EXPECT_NE(prefill.find("/o/logs/prefill-tp0.jsonl"), std::string::npos);
  const std::string router = join(router_args(c, p));
  EXPECT_NE(router.find("router --trace /t.csv"), std::string::npos) << router;
  EXPECT_NE(router.find("--time-scale 0.5 "), std::string::npos) << router;
  EXPECT_NE(router.find("--faults transfer@prefill:0.1,decode_fail@decode:0.1"), std::string::npos) << router;
  EXPECT_EQ(router.find("--orchestrator"), std::string::npos);
  p.orchestrator = 1005;
  c.fault_rate = 0;
  c.faults = "peer_death@decode/tp1:once";
  const std::string router2 = join(router_args(c, p));
  EXPECT_NE(router2.find("--faults peer_death@decode/tp1:once"), std::string::npos) << router2;
  EXPECT_NE(router2.find("--orchestrator tcp://127.0.0.1:1005"), std::string::npos) << router2;
  EXPECT_NE(router.find("--endpoint tcp://127.0.0.1:1004"), std::string::npos);
  EXPECT_NE(router.find("--prefill-dp 1 --decode-dp 1 "), std::string::npos) << router;
  EXPECT_EQ(router.find("--prefill-leader"), std::string::npos);  // from the ready frames
  EXPECT_EQ(router.find("--port-file"), std::string::npos);
  EXPECT_NE(router.find("--results /o/results.json"), std::string::npos);
  EXPECT_NE(router.find("--log-file /o/logs/router.jsonl"), std::string::npos);
  EXPECT_EQ(join(bootstrap_args(c, p)),
            "/x/kvferry bootstrap --host 127.0.0.1 --port 1001 --log-file /o/logs/bootstrap.jsonl");
  // dp == 1 on both sides: no DP options, names without a DP group.
  EXPECT_EQ(join(rank_args(c, p, true, 0)).find("--dp-rank"), std::string::npos);
}

// Data parallelism and port files: dp x tp ranks per engine, names carry the DP group when it is
// not 0, each leader without a known port binds any port and reports it in its port file.
TEST(Args, DataParallelRanksAndPortFiles) {
  ReplayConfig c;
  c.exe = "/x/kvferry";
  c.out = "/o";
  c.prefill_tp = 1;
  c.prefill_dp = 2;
  c.decode_tp = 2;
  c.decode_dp = 3;
  auto joined = [](const std::vector<std::string>& v) { return join(v) + " "; };
  EXPECT_EQ(rank_name(true, 0, 0), "prefill/tp0");
  EXPECT_EQ(rank_name(false, 1, 2), "decode/tp1/dp2");
  EXPECT_EQ(rank_file(false, 1, 2), "decode-tp1-dp2");
  Ports p;  // nothing known yet: everything binds port 0
  const std::string boot = joined(bootstrap_args(c, p));
  EXPECT_NE(boot.find("--port 0 --log-file /o/logs/bootstrap.jsonl --port-file /o/logs/bootstrap.port "),
            std::string::npos) << boot;
  const std::string router = joined(router_args(c, p));
  EXPECT_NE(router.find("--prefill-dp 2 --decode-dp 3 --endpoint tcp://127.0.0.1:0 "), std::string::npos)
      << router;
  EXPECT_NE(router.find("--port-file /o/logs/router.port "), std::string::npos) << router;
  p.bootstrap = 1001;
  p.router = 1004;
  const std::string leader = joined(rank_args(c, p, false, 0, 2));
  EXPECT_NE(leader.find("--engine-endpoint tcp://127.0.0.1:0 "), std::string::npos) << leader;
  EXPECT_NE(leader.find("--log-file /o/logs/decode-tp0-dp2.jsonl "), std::string::npos) << leader;
  EXPECT_NE(leader.find("--dp-rank 2 --peer-dp-size 2 "), std::string::npos) << leader;
  EXPECT_NE(leader.find("--port-file /o/logs/decode-tp0-dp2.port "), std::string::npos) << leader;
  p.decode_engines = {2000, 2001, 2002};
  const std::string follower = joined(rank_args(c, p, false, 1, 2));
  EXPECT_NE(follower.find("--engine-endpoint tcp://127.0.0.1:2002 "), std::string::npos) << follower;
  EXPECT_EQ(follower.find("--port-file"), std::string::npos) << follower;
  EXPECT_NE(follower.find("--dp-rank 2 --peer-dp-size 2 "), std::string::npos) << follower;
  // A prefill rank of group 0 still tells its DP size to the peers' engine (decode DP 3).
  const std::string prefill = joined(rank_args(c, p, true, 0, 0));
  EXPECT_NE(prefill.find("--dp-rank 0 --peer-dp-size 3 "), std::string::npos) << prefill;
  EXPECT_NE(prefill.find("--log-file /o/logs/prefill-tp0.jsonl "), std::string::npos) << prefill;
  EXPECT_EQ(prefill.find("--metrics"), std::string::npos) << prefill;  // no --metrics, no server
}

// --metrics: every rank of every DP group binds its metrics port itself and reports it in a port
// file; port file and final file are named like the rank's log file.
TEST(Args, MetricsForEveryRankOfEveryGroup) {
  ReplayConfig c;
  c.exe = "/x/kvferry";
  c.out = "/o";
  c.prefill_dp = 2;
  c.decode_tp = 2;
  c.decode_dp = 2;
  c.metrics = true;
  Ports p;
  for (auto [prefill, tp, dp] : {std::tuple{true, 0u, 0u}, std::tuple{true, 0u, 1u}, std::tuple{false, 1u, 1u}}) {
    const std::string file = rank_file(prefill, tp, dp);
    const std::string a = join(rank_args(c, p, prefill, tp, dp)) + " ";
    EXPECT_NE(a.find("--metrics-port-file /o/metrics/" + file + ".port --metrics-file /o/metrics/" + file +
                     ".prom "),
              std::string::npos)
        << a;
    EXPECT_EQ(a.find("--metrics-port "), std::string::npos) << a;  // no port picked ahead of its bind
  }
}

// --hosts: every address a child binds, advertises or is given is its host's; every child is
// started through its host's exec prefix.
TEST(Args, PlacementGivesEveryAddress) {
  ReplayConfig c;
  c.exe = "/x/kvferry";
  c.out = "/o";
  c.prefill_tp = 2;
  c.decode_dp = 2;
  c.transport = "tcp";
  auto hf = parse_hosts(R"({"hosts": {"a": {"address": "10.9.0.1", "exec": ["ip", "netns", "exec", "nsa"]},
                                      "b": {"address": "10.9.0.2"}, "c": {"address": "fd00::3"}},
      "place": {"bootstrap": "b", "router": "a", "replay": "c", "prefill": ["a", "b"], "decode": ["c", "b"]}})");
  ASSERT_TRUE(hf.ok()) << hf.status().str();
  ASSERT_TRUE(check_placement(*hf, 2, 1, 1, 2).ok());
  c.hosts = *hf;
  Ports p{.bootstrap = 1001, .router = 1004, .orchestrator = 1005, .prefill_engines = {1002},
          .decode_engines = {1003, 1006}};
  EXPECT_EQ(join(bootstrap_args(c, p)),
            "/x/kvferry bootstrap --host 10.9.0.2 --port 1001 --log-file /o/logs/bootstrap.jsonl");
  const std::string router = join(router_args(c, p)) + " ";
  EXPECT_NE(router.find("--endpoint tcp://10.9.0.1:1004 "), std::string::npos) << router;
  c.faults = "peer_death@decode/tp0:once";
  EXPECT_NE((join(router_args(c, p)) + " ").find("--orchestrator tcp://[fd00::3]:1005 "), std::string::npos);
  // prefill/tp1 on b: binds b, reaches its leader on a, the bootstrap on b, the router on a.
  const std::string follower = join(rank_args(c, p, true, 1, 0)) + " ";
  EXPECT_NE(follower.find("--bootstrap 10.9.0.2:1001 --engine-endpoint tcp://10.9.0.1:1002 "
                          "--router-endpoint tcp://10.9.0.1:1004 "),
            std::string::npos)
      << follower;
  EXPECT_NE(follower.find("--bind-host 10.9.0.2 "), std::string::npos) << follower;
  // decode/tp0/dp0 on c (IPv6): its own engine endpoint on its address.
  const std::string leader = join(rank_args(c, p, false, 0, 0)) + " ";
  EXPECT_NE(leader.find("--engine-endpoint tcp://[fd00::3]:1003 "), std::string::npos) << leader;
  EXPECT_NE(leader.find("--bind-host fd00::3 "), std::string::npos) << leader;
  const std::string dp1 = join(rank_args(c, p, false, 0, 1)) + " ";
  EXPECT_NE(dp1.find("--engine-endpoint tcp://10.9.0.2:1006 "), std::string::npos) << dp1;

  EXPECT_EQ(child_host(c, "router")->name, "a");
  EXPECT_EQ(child_host(c, "bootstrap")->name, "b");
  EXPECT_EQ(child_host(c, "prefill-tp1")->name, "b");
  EXPECT_EQ(child_host(c, "decode-tp0-dp1")->name, "b");
  EXPECT_EQ(child_host(c, "decode-tp1"), nullptr);  // no such rank
  EXPECT_EQ(child_exec(c, "prefill-tp0"), (std::vector<std::string>{"ip", "netns", "exec", "nsa"}));
  EXPECT_TRUE(child_exec(c, "prefill-tp1").empty());
  EXPECT_EQ(child_address(c, "decode-tp0"), "fd00::3");
  EXPECT_EQ(replay_address(c), "fd00::3");
  EXPECT_EQ(placement_text(c),
            "replay: host a (10.9.0.1): router, prefill/tp0\n"
            "replay: host b (10.9.0.2): bootstrap, prefill/tp1, decode/tp0/dp1\n"
            "replay: host c (fd00::3): the replay (orchestrator), decode/tp0\n");

  c.hosts.reset();  // without --hosts: loopback, no prefix, no --bind-host
  EXPECT_EQ(child_host(c, "router"), nullptr);
  EXPECT_EQ(child_address(c, "prefill-tp0"), "127.0.0.1");
  EXPECT_TRUE(child_exec(c, "prefill-tp0").empty());
  EXPECT_EQ(join(rank_args(c, p, true, 1, 0)).find("--bind-host"), std::string::npos);
  EXPECT_EQ(placement_text(c), "");
}

}  // namespace
}  // namespace kvferry::replay

namespace kvferry::replay {
namespace {

TEST(ChildArgs, InstancesNameTheirRanksAndBootstraps) {
  // Instance 0 is named as before instances existed; instance I > 0 as RankId's engine id.
  EXPECT_EQ(rank_name(true, 1, 0), "prefill/tp1");
  EXPECT_EQ(rank_name(true, 1, 0, 0), "prefill/tp1");
  EXPECT_EQ(rank_name(true, 1, 2, 3), "prefill3/tp1/dp2");
  EXPECT_EQ(rank_file(false, 0, 0, 1), "decode1-tp0");
  EXPECT_EQ(file_rank_name("decode1-tp0"), "decode1/tp0");
  EXPECT_EQ(bootstrap_file(0), "bootstrap");
  EXPECT_EQ(bootstrap_file(2), "bootstrap2");

  ReplayConfig c;
  c.exe = "/x/kvferry";
  c.trace = "/t.csv";
  c.out = "/o";
  c.prefill_instances = 2;
  c.decode_instances = 2;
  Ports p{.bootstrap = 2001, .router = 1004, .prefill_engines = {1002}, .decode_engines = {1003}};
  p.prefill_bootstraps = {1001, 2001};
  const std::string b = join(bootstrap_args(c, p, 1));
  EXPECT_NE(b.find("--port 2001 --log-file /o/logs/bootstrap1.jsonl"), std::string::npos) << b;
  p.bootstrap = 0;
  EXPECT_NE(join(bootstrap_args(c, p, 1)).find("--port-file /o/logs/bootstrap1.port"), std::string::npos);
  p.bootstrap = 1001;
  // A decode rank of instance 1: its instance (its engine id), its own files, instance 0's
  // bootstrap service as its default (the router names the room's prefill instance's).
  const std::string d = join(rank_args(c, p, false, 0, 0, 1));
  EXPECT_NE(d.find("--bootstrap 127.0.0.1:1001"), std::string::npos) << d;
  EXPECT_NE(d.find("--log-file /o/logs/decode1-tp0.jsonl"), std::string::npos) << d;
  EXPECT_NE(d.find("--instance 1"), std::string::npos) << d;
  EXPECT_EQ(join(rank_args(c, p, false, 0, 0, 0)).find("--instance"), std::string::npos);
  // The router learns every instance count and every prefill instance's bootstrap service.
  const std::string r = join(router_args(c, p));
  EXPECT_NE(r.find("--prefill-instances 2 --decode-instances 2 --prefill-bootstrap 127.0.0.1:1001 "
                   "--prefill-bootstrap 127.0.0.1:2001"),
            std::string::npos)
      << r;
  c.prefill_instances = 1;
  c.decode_instances = 1;
  EXPECT_EQ(join(router_args(c, p)).find("instances"), std::string::npos) << "1x1: the argv as before";
}

}  // namespace
}  // namespace kvferry::replay
