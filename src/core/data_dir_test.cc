#include "core/data_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvferry {
namespace {

namespace fs = std::filesystem;

// A scratch tree under the temp directory, removed at the end of the test.
struct Tree {
  fs::path root = fs::temp_directory_path() / ("kvferry-data-dir-" + std::to_string(::getpid()));
  Tree() { fs::remove_all(root); }
  ~Tree() { fs::remove_all(root); }
  void file(const fs::path& rel) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << "[]";
  }
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(DataDir, EnvironmentWinsEvenWithoutModelsFile) {
  Tree t;
  t.file("share/kvferry/models.json");
  EXPECT_EQ(data_dir_for((t.root / "bin/kvferry").string(), "/elsewhere/kvferry"), "/elsewhere/kvferry");
  // An empty value counts as unset.
  EXPECT_EQ(data_dir_for((t.root / "bin/kvferry").string(), ""), (t.root / "share/kvferry").string());
}

TEST(DataDir, InstalledLayoutBeforeBuildTree) {
  Tree t;
  t.file("share/kvferry/models.json");
  t.file("bin/share/kvferry/models.json");
  EXPECT_EQ(data_dir_for((t.root / "bin/kvferry").string(), nullptr), (t.root / "share/kvferry").string());
}

TEST(DataDir, BuildTreeCopyBesideTheExecutable) {
  Tree t;
  t.file("build/share/kvferry/models.json");
  EXPECT_EQ(data_dir_for((t.root / "build/kvferry").string(), nullptr),
            (t.root / "build/share/kvferry").string());
}

TEST(DataDir, NeitherFoundNamesTheInstallPlace) {
  Tree t;
  fs::create_directories(t.root / "bin");
  // A directory without models.json does not count.
  fs::create_directories(t.root / "bin/share/kvferry");
  EXPECT_EQ(data_dir_for((t.root / "bin/kvferry").string(), nullptr), (t.root / "share/kvferry").string());
}

// This test runs from build/src/: the build's copy of data/ (build/share/kvferry) is found through
// the install rule (build/src/../share/kvferry), and it is the source tree's models.json.
TEST(DataDir, TheBuildCopyIsTheSourceData) {
  ::unsetenv(kDataDirEnv);
  const fs::path models = default_models_file();
  ASSERT_TRUE(fs::is_regular_file(models)) << models;
  EXPECT_EQ(read_all(models), read_all(fs::path(KVFERRY_SOURCE_DIR) / "data/models.json"));
  EXPECT_TRUE(fs::is_regular_file(fs::path(data_dir()) / "traces/conversation_trace.jsonl"));
}

TEST(DataDir, TraceNamesResolveToBundledTraces) {
  ::unsetenv(kDataDirEnv);
  const std::string bundled = resolve_trace_file("conversation_trace.jsonl");
  EXPECT_EQ(bundled, (fs::path(data_dir()) / "traces/conversation_trace.jsonl").string());
  EXPECT_EQ(resolve_trace_file("no_such_trace.jsonl"), "no_such_trace.jsonl");
  EXPECT_EQ(resolve_trace_file("./conversation_trace.jsonl"), "./conversation_trace.jsonl");  // has a dir
  EXPECT_EQ(resolve_trace_file(""), "");
}

TEST(DataDir, EnvironmentReachesTheProcessRule) {
  ::setenv(kDataDirEnv, "/opt/kvferry-data", 1);
  EXPECT_EQ(data_dir(), "/opt/kvferry-data");
  EXPECT_EQ(default_models_file(), "/opt/kvferry-data/models.json");
  ::unsetenv(kDataDirEnv);
}

}  // namespace
}  // namespace kvferry
