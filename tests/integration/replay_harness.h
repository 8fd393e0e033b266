// Helpers for the multi-process replay tests: run the built CLI (KVFERRY_CLI) in a temporary
// directory, read report.json / results.json, and read every process's JSON log independently
// of the report. Header-only; each *_test.cc here is its own binary.
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace kvferry_itest {

// A rank parameter ("prefill/tp1") as a test name ("prefill_tp1").
inline std::string rank_param_name(const ::testing::TestParamInfo<std::string>& i) {
  std::string n = i.param;
  n[n.find('/')] = '_';
  return n;
}

namespace fs = std::filesystem;
using json = nlohmann::json;

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct CliRun {
  int exit_code = -1;  // or 128 + signal
  std::string output;  // stdout + stderr
  double seconds = 0;
};

// Starts `prog` (a path, or a name looked up in PATH) with `args`, stdout+stderr to `output`.
// Returns the pid (-1: not started).
inline pid_t start_program(const std::string& prog, const std::vector<std::string>& args, const fs::path& output) {
  std::vector<std::string> all = {prog};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, prog.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  EXPECT_EQ(rc, 0) << "cannot start " << prog;
  return rc == 0 ? pid : -1;
}

// Starts KVFERRY_CLI with `args`, stdout+stderr to `output`. Returns the pid (-1: not started).
inline pid_t start_cli(const std::vector<std::string>& args, const fs::path& output) {
  return start_program(KVFERRY_CLI, args, output);
}

// Waits for `pid`; its exit code, or 128 + signal (-1: no such child).
inline int wait_cli(pid_t pid) {
  int st = 0;
  if (pid <= 0 || waitpid(pid, &st, 0) != pid) return -1;
  return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

// Runs KVFERRY_CLI with `args` to completion, stdout+stderr to `output`.
inline CliRun run_cli(const std::vector<std::string>& args, const fs::path& output) {
  const auto t0 = std::chrono::steady_clock::now();
  CliRun r;
  r.exit_code = wait_cli(start_cli(args, output));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.output = slurp(output);
  return r;
}

// Processes (other than this test) whose command line mentions `needle`, as "pid: cmdline".
inline std::vector<std::string> processes_mentioning(const std::string& needle) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (!std::all_of(name.begin(), name.end(), ::isdigit) || std::stoi(name) == getpid()) continue;
    std::string cmd = slurp(e.path() / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos) found.push_back(name + ": " + cmd);
  }
  return found;
}

// Every JSON log line of every process (logs/*.jsonl), with its file; lines that are not JSON
// objects are listed in `bad`.
struct LogLines {
  std::vector<json> lines;
  std::vector<std::string> bad;
  static bool above_debug(const json& l) {
    const std::string level = l.value("level", "");
    return level != "trace" && level != "debug";
  }
};

inline LogLines read_log_lines(const fs::path& out) {
  LogLines logs;
  for (const auto& e : fs::directory_iterator(out / "logs")) {
    if (e.path().extension() != ".jsonl") continue;
    std::ifstream in(e.path());
    std::string line;
    for (size_t n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      json o = json::parse(line, nullptr, false);
      if (o.is_discarded() || !o.is_object()) {
        logs.bad.push_back(e.path().filename().string() + ":" + std::to_string(n));
        continue;
      }
      logs.lines.push_back(std::move(o));
    }
  }
  return logs;
}

// Every log line of every process (logs/*.jsonl), checked and counted by the test itself: each
// must be a JSON object with string ts, level, rank and msg, a known level, and a room (where
// present) as a decimal string; problems go to `bad` as "file:line: why".
struct Logs {
  size_t files = 0;
  size_t lines = 0;
  std::vector<std::string> bad;
  std::map<std::string, int> above_debug_by_room;  // level not trace/debug, by "room"
  std::map<std::string, size_t> lines_by_file;     // non-empty lines per file name
};

inline Logs read_logs(const fs::path& out) {
  Logs logs;
  for (const auto& e : fs::directory_iterator(out / "logs")) {
    if (e.path().extension() != ".jsonl") continue;
    ++logs.files;
    const std::string file = e.path().filename().string();
    std::ifstream in(e.path());
    std::string line;
    for (size_t n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      ++logs.lines;
      ++logs.lines_by_file[file];
      const std::string where = file + ":" + std::to_string(n) + ": ";
      const json o = json::parse(line, nullptr, false);
      if (o.is_discarded() || !o.is_object()) {
        logs.bad.push_back(where + "not JSON");
        continue;
      }
      for (const char* k : {"ts", "level", "rank", "msg"}) {
        if (!o.contains(k) || !o[k].is_string()) logs.bad.push_back(where + "no string " + k);
      }
      const std::string level = o.value("level", "");
      static const std::vector<std::string> kLevels = {"trace", "debug",  "info",
                                                      "warning", "error", "critical"};
      if (std::find(kLevels.begin(), kLevels.end(), level) == kLevels.end()) {
        logs.bad.push_back(where + "level '" + level + "'");
      }
      if (o.contains("room")) {
        if (!o["room"].is_string()) {
          logs.bad.push_back(where + "room is not a decimal string");
        } else if (level != "trace" && level != "debug") {
          ++logs.above_debug_by_room[o["room"].get<std::string>()];
        }
      }
    }
  }
  return logs;
}

// A temporary directory per test, removed when the test passed; no process may outlive a case.
class ReplayDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvferry_itest_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    EXPECT_TRUE(processes_mentioning(dir_.string()).empty());
    if (!HasFailure()) fs::remove_all(dir_);  // kept for inspection when a test failed
  }
  fs::path out() const { return dir_ / "out"; }
  json report() const { return json::parse(slurp(out() / "report.json")); }
  json results() const { return json::parse(slurp(out() / "results.json")); }
  // No wall-clock window here (docs/testing.md, "Under load"): the router's request timeout keeps
  // its default (300 s, the engines' own deadlines), because it runs from dispatch and so includes
  // a room's wait for decode pages behind earlier rooms, which on a busy host is far longer than on
  // an idle one (it was 40 s here, and rooms queued behind others' first-touch page faults went
  // past it: "router: no result within 40 s"). A hang still fails the test: its rooms end by the
  // engines' deadlines as unexpected failures, and CTest stops a test after 900 s.
  CliRun replay(std::vector<std::string> args) {
    args.insert(args.begin(), "replay");
    args.insert(args.end(), {"--out", out().string()});
    return run_cli(args, dir_ / "output.txt");
  }
  // A Mooncake trace of `n` requests, `gap_ms` apart, input lengths cycling through `tokens`;
  // with `pause_after` > 0, the requests from index `pause_after` on come `pause_ms` later.
  fs::path write_trace(size_t n, uint64_t gap_ms, const std::vector<uint64_t>& tokens,
                       size_t pause_after = 0, uint64_t pause_ms = 0) {
    const fs::path p = dir_ / "trace.jsonl";
    std::ofstream t(p);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t ts = i * gap_ms + (pause_after > 0 && i >= pause_after ? pause_ms : 0);
      t << "{\"timestamp\": " << ts << ", \"input_length\": " << tokens[i % tokens.size()]
        << ", \"output_length\": 4, \"hash_ids\": [" << i << "]}\n";
    }
    return p;
  }
  // Every engine's failed room names `rank` as origin, with the code of a dead peer.
  void expect_failures_name(const std::string& rank) {
    const json res = results();  // not a temporary: the loop reads into it
    for (const auto& q : res["requests"]) {
      for (const char* engine : {"prefill", "decode"}) {
        const json& e = q[engine];
        if (!e.is_object() || e["state"] != "Failed") continue;
        EXPECT_EQ(e["origin"], rank) << engine << " " << q.dump();
        EXPECT_EQ(e["code"], "peer_unreachable") << engine << " " << q.dump();
      }
    }
  }
  // Every rank of both engines has nothing left after the drain.
  void expect_no_leaks(const json& r) {
    for (const char* engine : {"prefill", "decode"}) {
      ASSERT_TRUE(r["leaks"][engine].is_array()) << engine;
      for (const auto& s : r["leaks"][engine]) {
        EXPECT_EQ(s["live_rooms"], 0) << s.dump();
        EXPECT_EQ(s["records"], 0) << s.dump();
        EXPECT_EQ(s["pages_in_use"], 0) << s.dump();
      }
    }
  }
  fs::path dir_;
};

}  // namespace kvferry_itest
