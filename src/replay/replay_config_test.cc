#include "replay/replay_config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/data_dir.h"
#include "process/host_memory.h"

namespace kvferry::replay {
namespace {

namespace fs = std::filesystem;

class Validate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvferry_config_test_" + std::to_string(::getpid()));
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
  c.prefill_ms_per_layer = -0.5;
  EXPECT_NE(error_of(c).find("--prefill-ms-per-layer must be in [0, 10000] ms"), std::string::npos);
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
  // corrupt is caught by the integrity check only: refused without --integrity.
  c = good();
  c.faults = "corrupt@decode:0.1";
  EXPECT_NE(error_of(c).find("--faults corrupt needs --integrity"), std::string::npos);
  c.integrity = true;
  ASSERT_TRUE(validate(c).ok());
  EXPECT_EQ(nlohmann::json::parse(c.to_json())["integrity"], true);
}

TEST_F(Validate, HostsFilePlacesTheProcesses) {
  const std::string path = (dir_ / "hosts.json").string();
  auto write_hosts = [&](const std::string& prefill, const std::string& decode) {
    std::ofstream(path) << R"({"hosts": {"h1": {"address": "10.71.0.1", "exec": ["ip", "netns", "exec", "kvhh1"]},
                                         "h2": {"address": "10.71.0.2", "exec": ["ip", "netns", "exec", "kvhh2"]}},
                               "place": {"bootstrap": "h1", "router": "h1", "prefill": )"
                        << prefill << R"(, "decode": )" << decode << "}}";
  };
  write_hosts(R"(["h1", "h1"])", R"(["h2", "h2"])");
  ReplayConfig c = good();
  c.hosts_file = path;
  c.transport = "tcp";
  ASSERT_TRUE(validate(c).ok());
  ASSERT_TRUE(c.hosts.has_value());
  EXPECT_EQ(c.hosts->rank(false, 1, 0).address, "10.71.0.2");
  auto j = nlohmann::json::parse(c.to_json());
  EXPECT_EQ(j["hosts_file"], path);
  EXPECT_EQ(j["hosts"]["place"]["decode"], nlohmann::json::array({"h2", "h2"}));
  EXPECT_EQ(j["hosts"]["place"]["replay"], "h1");
  EXPECT_EQ(j["hosts"]["hosts"]["h2"]["address"], "10.71.0.2");

  // Shared memory cannot cross machines: refused when prefill and decode are apart.
  c = good();
  c.hosts_file = path;
  EXPECT_EQ(error_of(c), "--transport shm needs the prefill and decode ranks on one host, but --hosts " + path +
                             " places prefill/tp0 on h1 and decode/tp0 on h2 (separate machines share no "
                             "memory): use --transport tcp");
  write_hosts(R"(["h2", "h2"])", R"(["h2", "h2"])");  // one host for both engines: shm is fine
  EXPECT_TRUE(validate(c).ok());
  EXPECT_FALSE(c.hosts->engines_apart());

  c = good();
  c.transport = "tcp";
  c.hosts_file = path;
  c.decode_tp = 1;  // two decode hosts for one decode rank
  EXPECT_EQ(error_of(c), "--hosts " + path + ": place.decode names 2 hosts but the decode engine has 1 ranks "
                         "(TP 1 x DP 1): one host per rank, index dp_rank * 1 + tp_rank");
  c.hosts_file = (dir_ / "missing.json").string();
  EXPECT_EQ(error_of(c), "--hosts " + c.hosts_file + ": cannot read the file");

  c = good();  // without --hosts: no placement in the config
  ASSERT_TRUE(validate(c).ok());
  EXPECT_FALSE(c.hosts.has_value());
  EXPECT_FALSE(nlohmann::json::parse(c.to_json()).contains("hosts"));
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

}  // namespace
}  // namespace kvferry::replay

namespace kvferry::replay {
namespace {

class ValidateInstances : public Validate {};

TEST_F(ValidateInstances, XpydOptionsAndWhatTheyRefuse) {
  ReplayConfig c = good();
  ASSERT_TRUE(validate(c).ok());
  auto j = nlohmann::json::parse(c.to_json());
  EXPECT_FALSE(j.contains("prefill_instances")) << "one of each: the config is as before instances";
  c = good();
  c.prefill_instances = 3;
  c.decode_instances = 2;
  ASSERT_TRUE(validate(c).ok());
  j = nlohmann::json::parse(c.to_json());
  EXPECT_EQ(j["prefill_instances"], 3);
  EXPECT_EQ(j["decode_instances"], 2);
  c = good();
  c.prefill_instances = 0;
  EXPECT_NE(error_of(c).find("--prefill-instances must be in 1..16"), std::string::npos);
  c = good();
  c.decode_instances = 2;
  c.faults = "timeout@prefill:0.1";
  EXPECT_NE(error_of(c).find("timeout at a prefill rank is not supported with more than one decode instance"),
            std::string::npos);
  c.faults = "timeout@decode:0.1";
  EXPECT_TRUE(validate(c).ok()) << "timeout at a decode rank works with several decode instances";
  c = good();
  c.decode_instances = 17;
  EXPECT_NE(error_of(c).find("--decode-instances must be in 1..16"), std::string::npos);
  c = good();
  c.decode_instances = 2;
  c.faults = "peer_death@prefill/tp1:once";
  EXPECT_NE(error_of(c).find("--faults peer_death: not supported with --prefill-instances 1 --decode-instances 2"),
            std::string::npos);
  c = good();
  c.prefill_instances = 2;
  c.faults = "pause@decode/tp0:500";
  EXPECT_NE(error_of(c).find("--faults pause: not supported"), std::string::npos);
  c = good();
  c.prefill_instances = 2;
  c.faults = "transfer@prefill:0.1,decode_fail@decode:0.1";  // room faults: placed per instance
  EXPECT_TRUE(validate(c).ok());
  c = good();
  c.decode_instances = 2;
  c.hosts_file = "/no/such/hosts.json";
  EXPECT_NE(error_of(c).find("--hosts places one prefill and one decode instance"), std::string::npos);
  // Every instance's pools count against the machine.
  c = good();
  c.pool_mib = 1ull << 20;  // 1 TiB per decode rank
  c.decode_instances = 8;
  EXPECT_NE(error_of(c).find("2 x --prefill-pool-mib 64 + 16 x --pool-mib"), std::string::npos);
}

TEST_F(ValidateInstances, ScaleAndWhatItRefuses) {
  ReplayConfig c = good();
  c.scale = "t=4s:-decode,t=2s:+decode";
  ASSERT_TRUE(validate(c).ok());
  ASSERT_EQ(c.scale_events.size(), 2u);
  EXPECT_EQ(c.scale_events[0].instance, 1u);
  EXPECT_EQ(instances_in_all(c, Role::kDecode), 2u);
  EXPECT_EQ(instances_in_all(c, Role::kPrefill), 1u);
  auto j = nlohmann::json::parse(c.to_json());
  EXPECT_EQ(j["scale"], "t=4s:-decode,t=2s:+decode");
  EXPECT_EQ(j["decode_instances"], 1);
  c = good();
  c.scale = "t=1s:-prefill";
  EXPECT_NE(error_of(c).find("last live prefill instance"), std::string::npos);
  c = good();
  c.scale = "t=1s:+prefill";
  c.metrics = true;
  EXPECT_NE(error_of(c).find("--scale cannot be given with --metrics"), std::string::npos);
  c = good();
  c.scale = "t=1s:+prefill";
  c.hosts_file = "/no/such/hosts.json";
  EXPECT_NE(error_of(c).find("--scale starts and removes instances on this host only"), std::string::npos);
  c = good();
  c.scale = "t=1s:+decode";
  c.faults = "peer_death@prefill/tp1:once";
  EXPECT_NE(error_of(c).find("--scale t=1s:+decode"), std::string::npos);
  c = good();
  c.scale = "t=1s:+decode";
  c.faults = "link_down@a:100";
  EXPECT_NE(error_of(c).find("not supported"), std::string::npos);
}

}  // namespace
}  // namespace kvferry::replay
