#include "replay/orchestrator.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvferry::replay {
namespace {

namespace fs = std::filesystem;

class Orchestrator : public ::testing::Test {
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
  fs::path dir_;
};

// The supervision path end to end with a stand-in executable: a "rank" that cannot start stops
// the replay, names itself, and nothing it started survives.
TEST_F(Orchestrator, ChildThatCannotStartStopsTheReplay) {
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
