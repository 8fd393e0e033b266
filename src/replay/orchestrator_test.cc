#include "replay/orchestrator.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "core/data_dir.h"
#include "process/host_memory.h"

namespace kvferry::replay {
namespace {

namespace fs = std::filesystem;

// A command line as one string, arguments separated by one space.
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

class Validate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvferry_orch_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream t(dir_ / "ok.csv");
    t << "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
      << "2023-11-16 18:17:03.9799600,4808,10\r\n"
      << "2023-11-16 18:17:04.0319600,3180,8\r\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  ReplayConfig good() {
    ReplayConfig c;
    c.trace = (dir_ / "ok.csv").string();
    c.model = "Llama-3.1-8B";
    c.prefill_tp = 2;
    c.decode_tp = 2;
    c.pool_mib = 256;
    c.prefill_pool_mib = 64;
    c.out = (dir_ / "out").string();
    return c;
  }
  std::string error_of(ReplayConfig c) {
    Status st = validate(c);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    return st.message();
  }
  fs::path dir_;
};

TEST_F(Validate, AcceptsAndFillsDefaults) {
  ReplayConfig c = good();
  c.models_file.clear();
  c.pool_mib = 0;
  c.out = "relative/out/";
  ASSERT_TRUE(validate(c).ok());
  EXPECT_EQ(c.models_file, default_models_file());  // the build copy (build/share/kvferry)
  EXPECT_TRUE(c.pool_mib_auto);
  EXPECT_GE(c.pool_mib, 64u);
  EXPECT_LE(c.pool_mib, 7168u);
  EXPECT_TRUE(fs::path(c.out).is_absolute());
  EXPECT_NE(c.out.back(), '/');
  EXPECT_FALSE(c.exe.empty());
  const auto j = nlohmann::json::parse(c.to_json());
  EXPECT_EQ(j["prefill_tp"], 2);
  EXPECT_EQ(j["model"], "Llama-3.1-8B");
  EXPECT_EQ(j["pool_mib_auto"], true);
  EXPECT_EQ(j["transport"], "shm");
}

TEST_F(Validate, MalformedTraceNamesTheLine) {
  std::ofstream t(dir_ / "bad.jsonl");
  t << "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": []}\n"
    << "{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": []}\n"
    << "{\"timestamp\": 2, \"input_length\": \n";
  t.close();
  ReplayConfig c = good();
  c.trace = (dir_ / "bad.jsonl").string();
  const std::string msg = error_of(c);
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad.jsonl"), std::string::npos) << msg;
}

TEST_F(Validate, UnknownModelListsKnownOnes) {
  ReplayConfig c = good();
  c.model = "GPT-5";
  const std::string msg = error_of(c);
  EXPECT_NE(msg.find("GPT-5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Llama-3.1-8B"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Qwen2.5-7B"), std::string::npos) << msg;
}

TEST_F(Validate, RejectsBadOptions) {
  ReplayConfig c = good();
  c.page_size = 0;
  EXPECT_NE(error_of(c).find("--page-size"), std::string::npos);
  c = good();
  c.transport = "rdma";
  EXPECT_NE(error_of(c).find("unknown transport 'rdma' (known: shm, tcp)"), std::string::npos);
  c = good();
  c.fault_rate = 1.5;
  EXPECT_NE(error_of(c).find("--fault-rate"), std::string::npos);
  c = good();
  c.time_scale = -1;
  EXPECT_NE(error_of(c).find("--time-scale"), std::string::npos);
  c = good();
  c.decode_tp = 0;
  EXPECT_NE(error_of(c).find("--decode-tp"), std::string::npos);
  c = good();
  c.trace = (dir_ / "missing.csv").string();
  EXPECT_NE(error_of(c).find("missing.csv"), std::string::npos);
  c = good();
  c.pool_mib = 1;  // a 64-token page of Llama-3.1-8B at TP2 is 64 x 32 x 2 x 4 x 128 x 2 = 8 MiB
  EXPECT_NE(error_of(c).find("--pool-mib 1"), std::string::npos);
  c = good();
  c.break_rank = "decode/tp2";  // TP is 2
  EXPECT_NE(error_of(c).find("--test-break-rank"), std::string::npos);
  c = good();
  c.pool_mib = uint64_t(1) << 30;  // 1 PiB
  EXPECT_NE(error_of(c).find("this machine has"), std::string::npos);
  c = good();
  c.models_file = (dir_ / "none.json").string();
  EXPECT_NE(error_of(c).find("none.json"), std::string::npos);
  c = good();
  c.faults = "transfer@prefill:0.1,melt@decode:0.1";
  EXPECT_NE(error_of(c).find("'melt@decode:0.1'"), std::string::npos);
  c = good();
  c.faults = "transfer:0.1";
  c.fault_rate = 0.1;
  EXPECT_NE(error_of(c).find("not both"), std::string::npos);
  c = good();
  c.faults = "transfer@prefill/tp1:once,decode_fail:once,abort:once";  // 3 > 2 requests
  EXPECT_NE(error_of(c).find("only 2 requests"), std::string::npos);
  c = good();
  c.max_requests = 1;
  c.faults = "peer_death@decode/tp1:once";
  EXPECT_NE(error_of(c).find("at least 2 requests"), std::string::npos);
  c = good();
  c.restart_delay_ms = -1;
  EXPECT_NE(error_of(c).find("--restart-delay-ms"), std::string::npos);
  c = good();
  c.deadlines.engine_timeout_ms = 0;
  EXPECT_NE(error_of(c).find("--engine-timeout-ms must be > 0"), std::string::npos);
}

TEST_F(Validate, FaultPlanAndDeadlinesInTheConfig) {
  ReplayConfig c = good();
  c.fault_rate = 0.5;
  c.deadlines.fault_timeout_ms = 500;
  ASSERT_TRUE(validate(c).ok());
  EXPECT_EQ(c.fault_plan.str(), "transfer@prefill:0.25,decode_fail@decode:0.25");
  auto j = nlohmann::json::parse(c.to_json());
  EXPECT_EQ(j["faults"], "transfer@prefill:0.25,decode_fail@decode:0.25");
  EXPECT_EQ(j["deadlines"]["fault_timeout_ms"], 500);
  EXPECT_EQ(j["deadlines"]["heartbeat_timeout_ms"], Deadlines{}.heartbeat_timeout_ms);
  EXPECT_EQ(j["restart_delay_ms"], 1500);
  c = good();
  c.faults = "peer_death@prefill/tp0:once,abort:0.5";
  ASSERT_TRUE(validate(c).ok());
  EXPECT_TRUE(c.fault_plan.has_peer_death());
}

TEST(DefaultPool, RuleAndBounds) {
  const uint64_t gib = 1ull << 30;
  // 24 GiB available: 60% = 14745 MiB; minus 2 x 1024 staging = 12697; / 2 = 6348.
  EXPECT_EQ(default_pool_mib(24 * gib, 2, 1024, 2), 6348u);
  EXPECT_EQ(default_pool_mib(100 * gib, 1, 1024, 1), 7168u);  // capped
  EXPECT_EQ(default_pool_mib(1 * gib, 4, 1024, 4), 64u);      // floor
  EXPECT_EQ(default_pool_mib(0, 1, 1024, 1), 64u);
  EXPECT_GT(process::mem_available_bytes(), 0u);
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

// The supervision path end to end with a stand-in executable: a "rank" that cannot start stops
// the replay, names itself, and nothing it started survives.
TEST_F(Validate, ChildThatCannotStartStopsTheReplay) {
  const fs::path fake = dir_ / "fake_kvferry.sh";
  {
    std::ofstream f(fake);
    // Listening children bind port 0 and write the port file they are given (--port-file).
    f << "#!/bin/sh\n"
         "pf=''; prev=''; for a in \"$@\"; do [ \"$prev\" = --port-file ] && pf=$a; prev=$a; done\n"
         "listen() { exec /usr/bin/python3 -c \"import socket,time,os;s=socket.socket();"
         "s.bind(('127.0.0.1',0));s.listen();open('$pf.tmp','w').write(str(s.getsockname()[1]));"
         "os.rename('$pf.tmp','$pf');time.sleep(60)\"; }\n"
         "case \"$1\" in\n"
         "  bootstrap|router) listen ;;\n"
         "  rank) case \"$*\" in *'--role decode --tp-rank 1'*) echo 'cannot map the pool' >&2; "
         "exit 4;; esac; [ -n \"$pf\" ] && listen; exec sleep 60 ;;\n"
         "esac\n";
  }
  fs::permissions(fake, fs::perms::owner_all);
  ReplayConfig c = good();
  c.exe = fake.string();
  std::ostringstream out, err;
  const int rc = run_replay(c, out, err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.str().find("decode/tp1"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("exited with code 4"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("cannot map the pool"), std::string::npos) << err.str();
  // No process whose command line names our directory survives.
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (!std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream cmd(e.path() / "cmdline");
    std::string line((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    EXPECT_EQ(line.find(dir_.string()), std::string::npos) << "survivor pid " << name;
  }
  std::ifstream rep(dir_ / "out" / "report.json");
  ASSERT_TRUE(rep.good());
  const auto j = nlohmann::json::parse(rep);
  EXPECT_EQ(j["status"], "failed");
  EXPECT_NE(j["error"].get<std::string>().find("decode/tp1"), std::string::npos);
}

}  // namespace
}  // namespace kvferry::replay
