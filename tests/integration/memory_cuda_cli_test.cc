// `kvferry replay --memory cuda` and `kvferry bench --memory cuda` on a machine without a usable GPU
// (or a kvferry built without CUDA): the real CLI exits with 2 and says why, before any process,
// file or directory of the run exists (docs/gpu.md, "The CLI"). On a machine with a GPU the
// device-memory runs are make test-gpu's; these tests skip there.
#include <string>
#include <vector>

#include "device/device_copy.h"
#include "replay_harness.h"

namespace kvferry_itest {
namespace {

const std::string kAzure = KVFERRY_SOURCE_DIR "/data/traces/AzureLLMInferenceTrace_code.csv";

class MemoryCuda : public ReplayDir {
 protected:
  void SetUp() override {
    ReplayDir::SetUp();
    auto seam = kvferry::device::open_cuda_device_copy();
    if (seam.ok()) GTEST_SKIP() << "this machine has a usable GPU: --memory cuda is make test-gpu's";
    why_ = seam.status().message();
  }
  std::string why_;  // the seam's refusal: what the CLI must name
};

TEST_F(MemoryCuda, ReplayExitsAtOnceNamingWhy) {
  const CliRun run = replay({"--trace", kAzure, "--max-requests", "3", "--memory", "cuda"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("kvferry replay: --memory cuda: no GPU to use: " + why_), std::string::npos)
      << run.output;
  EXPECT_FALSE(fs::exists(out())) << "the replay started: " << run.output;  // no report, no logs
}

TEST_F(MemoryCuda, BenchExitsAtOnceNamingWhy) {
  const fs::path result = dir_ / "bench.json";
  const CliRun run = run_cli({"bench", "--memory", "cuda", "--duration", "1", "--out", result.string(),
                              "--work-dir", (dir_ / "work").string()},
                             dir_ / "output.txt");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("kvferry bench: --memory cuda: no GPU to use: " + why_), std::string::npos)
      << run.output;
  EXPECT_FALSE(fs::exists(result)) << run.output;
  EXPECT_FALSE(fs::exists(dir_ / "work")) << "the bench started ranks: " << run.output;
}

TEST_F(MemoryCuda, AnUnknownMemoryKindIsAUsageError) {
  const CliRun run = replay({"--trace", kAzure, "--max-requests", "3", "--memory", "rocm"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("--memory: rocm not in {host,cuda}"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(out()));
}

}  // namespace
}  // namespace kvferry_itest
