// `kvferry bench` as real processes (orchestrator + one prefill and one decode rank over shm):
// a short run must produce a JSON whose figures are consistent with each other, so the benchmark
// behind `make bench` cannot rot. No figure is compared against a speed target here.
#include <gtest/gtest.h>

#include <cstdlib>

#include "replay_harness.h"

namespace kvferry_itest {
namespace {

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvferry_bench_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    if (!HasFailure()) fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_F(BenchTest, ShortShmRunReportsConsistentFigures) {
  // Llama-3.1-8B: 32 layers x K,V x 8 heads x 128 x 2 bytes = 131072 bytes per token.
  // Rooms of 16 MiB and a 1 s warm-up: the measured window must see completed rooms on a busy host
  // too (`make test-hog`: with 64 MiB rooms and a 0.3 s warm-up no room completed inside the 1.5 s
  // window, the first touch of fresh pool pages running at tens of MB/s on the test VM).
  constexpr uint64_t kTokens = 128, kBytesPerToken = 131072, kConcurrency = 2;
  constexpr uint64_t kRoomBytes = kTokens * kBytesPerToken;
  const fs::path out = dir_ / "bench.json";
  CliRun r = run_cli({"bench", "--model", "Llama-3.1-8B", "--tokens", std::to_string(kTokens), "--page-size", "64",
                      "--concurrency", std::to_string(kConcurrency), "--transport", "shm", "--duration", "1.5",
                      "--warmup", "1", "--out", out.string()},
                     dir_ / "cli.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("GB/s"), std::string::npos) << r.output;
  json j = json::parse(slurp(out));
  const uint64_t rooms = j.at("rooms").get<uint64_t>();
  ASSERT_GT(rooms, 0u);
  EXPECT_EQ(j.at("failed").get<uint64_t>(), 0u);
  EXPECT_EQ(j.at("open_at_exit").get<uint64_t>(), 0u);
  // Every counted room moved its whole KV (plus one aux record of at most 64 bytes).
  const uint64_t completed = j.at("completed_bytes").get<uint64_t>();
  EXPECT_GE(completed, rooms * kRoomBytes);
  EXPECT_LE(completed, rooms * (kRoomBytes + 64));
  // Bytes moved inside the window: the counted rooms, less the part before the window of those
  // already in flight at its start, plus the part inside it of those still in flight at its end
  // (at most `concurrency` rooms at each edge).
  const uint64_t bytes = j.at("bytes").get<uint64_t>();
  EXPECT_GE(bytes + kConcurrency * (kRoomBytes + 64), completed);
  EXPECT_LE(bytes, completed + kConcurrency * (kRoomBytes + 64));
  const double window = j.at("window_s").get<double>();
  EXPECT_DOUBLE_EQ(window, 1.5);
  EXPECT_NEAR(j.at("gb_per_s").get<double>(), static_cast<double>(bytes) / 1e9 / window, 1e-9);
  EXPECT_NEAR(j.at("rooms_per_s").get<double>(), static_cast<double>(rooms) / window, 1e-9);
  const json& lat = j.at("transfer_latency_ms");
  EXPECT_EQ(lat.at("count").get<uint64_t>(), rooms);
  EXPECT_GT(lat.at("p50").get<double>(), 0.0);
  EXPECT_LE(lat.at("p50").get<double>(), lat.at("p90").get<double>());
  EXPECT_LE(lat.at("p90").get<double>(), lat.at("p99").get<double>());
  EXPECT_LE(lat.at("p99").get<double>(), lat.at("max").get<double>());
  // A room cannot take longer than the run.
  EXPECT_LT(lat.at("max").get<double>(), 1000 * (window + 1 + 5));
  EXPECT_GT(j.at("cpu_s").get<double>(), 0.0);
  EXPECT_GT(j.at("cpu_s_per_gb").get<double>(), 0.0);
  // 128 tokens at 64 per page is 2 pages; one chunk: a write is 2 pages x 64 tokens x 8 heads x 256 B.
  EXPECT_EQ(j.at("write_bytes").get<uint64_t>(), 2u * 64 * 8 * 128 * 2);
  EXPECT_FALSE(j.contains("transfer_tail_ms")) << "no compute model, no transfer tail";
  ASSERT_EQ(j.at("ranks").size(), 2u);
  for (const json& rank : j.at("ranks")) {
    EXPECT_GT(rank.at("rss_end").at("rss_kib").get<uint64_t>(), 0u) << rank.dump();
    EXPECT_GT(rank.at("rss_end").at("anon_kib").get<uint64_t>(), 0u) << rank.dump();
    // The touched pool (2 rooms of 16 MiB) is resident shared memory.
    EXPECT_GE(rank.at("rss_end").at("shmem_kib").get<uint64_t>() * 1024, kConcurrency * kRoomBytes)
        << rank.dump();
    EXPECT_GE(rank.at("rooms_total").get<uint64_t>(), rooms) << rank.dump();
  }
}

TEST_F(BenchTest, ComputeModelLayerwiseReportsTheTransferTail) {
  // 1 ms of simulated compute per layer (32 ms a room), each layer sent as its compute ends.
  const fs::path out = dir_ / "lw.json";
  CliRun r = run_cli({"bench", "--model", "Llama-3.1-8B", "--tokens", "128", "--page-size", "64", "--concurrency",
                      "1", "--transport", "shm", "--duration", "1.5", "--warmup", "1", "--prefill-ms-per-layer", "1",
                      "--layerwise", "--out", out.string()},
                     dir_ / "cli.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("layer-wise: transfer tail"), std::string::npos) << r.output;
  json j = json::parse(slurp(out));
  EXPECT_EQ(j.at("failed").get<uint64_t>(), 0u);
  EXPECT_EQ(j.at("config").at("prefill_ms_per_layer").get<double>(), 1.0);
  EXPECT_TRUE(j.at("config").at("layerwise").get<bool>());
  const json& tail = j.at("transfer_tail_ms");
  ASSERT_GT(tail.at("count").get<uint64_t>(), 0u) << j.dump();
  EXPECT_EQ(tail.at("count"), j.at("room_latency_ms").at("count"));
  // The last layer is sent only once its compute ended, so decode's Success comes after it.
  EXPECT_GE(j.at("transfer_tail_cdf_ms").at(0).get<double>(), 0.0);
  EXPECT_LE(tail.at("p50").get<double>(), tail.at("max").get<double>());
  // Every counted room still moved its whole KV once: 128 tokens x 131072 bytes (+ the aux record).
  const uint64_t rooms = j.at("rooms").get<uint64_t>();
  EXPECT_GE(j.at("completed_bytes").get<uint64_t>(), rooms * 128 * 131072);
  EXPECT_LE(j.at("completed_bytes").get<uint64_t>(), rooms * (128 * 131072 + 64));
}

TEST_F(BenchTest, EngineMemoryMovesWholeRoomsOverShmAndTcp) {
  // --memory engine: each rank's KV as per-layer buffers it allocates and registers (vLLM's per-layer
  // tensors; docs/vllm.md "Throughput"), not kvferry's pool. Every counted room still moves its whole
  // KV over both transports, and over shm the KV is no longer shared memory (the pool's is).
  constexpr uint64_t kRoomBytes = 128ull * 131072;
  for (const char* transport : {"shm", "tcp"}) {
    const fs::path out = dir_ / (std::string(transport) + "_engine.json");
    CliRun r = run_cli({"bench", "--model", "Llama-3.1-8B", "--tokens", "128", "--page-size", "16", "--concurrency",
                        "2", "--transport", transport, "--duration", "1.5", "--warmup", "1", "--memory", "engine",
                        "--out", out.string()},
                       dir_ / (std::string(transport) + "_cli.txt"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(", engine buffers:"), std::string::npos) << r.output;
    json j = json::parse(slurp(out));
    EXPECT_EQ(j.at("config").at("memory").get<std::string>(), "engine");
    const uint64_t rooms = j.at("rooms").get<uint64_t>();
    ASSERT_GT(rooms, 0u) << transport;
    EXPECT_EQ(j.at("failed").get<uint64_t>(), 0u);
    EXPECT_GE(j.at("completed_bytes").get<uint64_t>(), rooms * kRoomBytes);
    EXPECT_LE(j.at("completed_bytes").get<uint64_t>(), rooms * (kRoomBytes + 64));
    for (const json& rank : j.at("ranks")) {
      EXPECT_LT(rank.at("rss_end").at("shmem_kib").get<uint64_t>() * 1024, 2 * kRoomBytes) << rank.dump();
    }
  }
  CliRun bad = run_cli({"bench", "--memory", "gpu", "--duration", "1"}, dir_ / "bad.txt");
  EXPECT_NE(bad.exit_code, 0) << bad.output;  // CLI11 refuses it (exit 105)
  EXPECT_NE(bad.output.find("--memory"), std::string::npos) << bad.output;
}

TEST_F(BenchTest, BadOptionsAreRefusedBeforeAnyRankStarts) {
  CliRun r = run_cli({"bench", "--model", "No-Such-Model", "--duration", "1", "--out", (dir_ / "b.json").string()},
                     dir_ / "cli.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("No-Such-Model"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "b.json"));
  r = run_cli({"bench", "--tokens", "0", "--duration", "1"}, dir_ / "cli2.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tokens"), std::string::npos) << r.output;
  r = run_cli({"bench", "--transfer-shards", "9", "--duration", "1"}, dir_ / "cli3.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--transfer-shards must be in 1..8"), std::string::npos) << r.output;
  r = run_cli({"bench", "--prefill-ms-per-layer", "-1", "--duration", "1"}, dir_ / "cli4.txt");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--prefill-ms-per-layer must be in [0, 10000] ms"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvferry_itest
