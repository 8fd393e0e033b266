// Issue 6: a replay's metrics (scraped while it runs, and the final files) agree with its report;
// `kvferry logs --json` names the injected origin of every failed room as the report does;
// Ctrl-C (SIGINT) stops every process and still leaves a partial report.
#include <httplib.h>
#include <signal.h>

#include <map>
#include <set>
#include <thread>

#include "replay_harness.h"

namespace kvferry_itest {
namespace {

const std::string kTrace = KVFERRY_SOURCE_DIR "/data/traces/conversation_trace.jsonl";

// Exit code (128 + signal when killed) once `pid` exits; -1 if it did not within `timeout`.
int wait_exit(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

// Samples of a Prometheus text exposition: "name{labels}" -> value.
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

// Sum of every sample of `name` whose labels contain all of `labels` (e.g. "outcome=\"success\"").
double sum(const std::map<std::string, double>& s, const std::string& name, const std::vector<std::string>& labels = {}) {
  double total = 0;
  for (const auto& [series, v] : s) {
    if (series.rfind(name + "{", 0) != 0) continue;
    bool all = true;
    for (const auto& l : labels) all = all && series.find(l) != std::string::npos;
    if (all) total += v;
  }
  return total;
}

class Observability : public ReplayDir {};

TEST_F(Observability, MetricsAndLogsAgreeWithTheReport) {
  const pid_t pid = start_cli({"replay", "--trace", kTrace, "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                               "--decode-tp", "2", "--pool-mib", "1024", "--prefill-pool-mib", "256", "--page-size",
                               "16", "--max-requests", "40", "--fault-rate", "0.1", "--seed", "3", "--metrics",
                               "--out", out().string()},
                              dir_ / "output.txt");
  // While it runs: every rank answers /metrics; remember one scrape per rank taken mid-replay.
  std::map<std::string, std::map<std::string, double>> during;
  int rc = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      rc = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
      break;
    }
    if (during.size() < 4 && fs::exists(out() / "metrics.json")) {
      json ports = json::parse(slurp(out() / "metrics.json"), nullptr, false);
      for (auto& [rank, m] : ports.is_object() ? ports.items() : json::object().items()) {
        if (during.count(rank) || !m["port"].is_number()) continue;  // null until the rank reported it
        httplib::Client c("127.0.0.1", m["port"].get<int>());
        c.set_connection_timeout(0, 200'000);
        auto res = c.Get("/metrics");
        if (!res || res->status != 200) continue;
        auto s = samples(res->body);
        if (sum(s, "kvferry_rooms_total") + sum(s, "kvferry_rooms_in_flight") > 0) during[rank] = s;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(rc, 0) << slurp(dir_ / "output.txt");
  ASSERT_EQ(during.size(), 4u) << "not every rank was scraped while rooms were live";
  const json r = report();
  const json ports = json::parse(slurp(out() / "metrics.json"));
  const uint64_t ok = r["requests"]["succeeded"], failed = r["requests"]["failed"], rejected = r["requests"]["rejected"];
  ASSERT_GT(failed, 0u);
  std::map<std::string, std::map<std::string, double>> final;
  for (auto& [rank, m] : ports.items()) final[rank] = samples(slurp(m["final"].get<std::string>()));
  ASSERT_EQ(final.size(), 4u);
  double sent = 0, verified = 0, mismatched = 0, local = 0, propagated = 0;
  for (auto& [rank, s] : final) {
    SCOPED_TRACE(rank);
    EXPECT_EQ(sum(s, "kvferry_rooms_total", {"outcome=\"success\""}), ok);
    EXPECT_EQ(sum(s, "kvferry_rooms_total", {"outcome=\"failed\""}), failed + rejected);
    for (const char* leak : {"kvferry_live_rooms", "kvferry_registry_records", "kvferry_pages_in_use",
                             "kvferry_rooms_in_flight"})
      EXPECT_EQ(sum(s, leak), 0) << leak;
    // Qwen2.5-7B has 4 KV heads: at TP 2 on both sides each rank exchanges data with one peer.
    EXPECT_EQ(sum(s, "kvferry_peer_connections"), 1);
    // Counters never go back: the final values are at least the mid-replay ones.
    for (const auto& [series, v] : during[rank])
      if (series.find("_total") != std::string::npos) {
        EXPECT_GE(s[series], v) << series;
      }
    if (rank.rfind("decode", 0) == 0) {
      EXPECT_EQ(sum(s, "kvferry_transfer_latency_seconds_count"), ok);
    }
    sent += sum(s, "kvferry_sent_bytes_total");
    verified += sum(s, "kvferry_verified_bytes_total");
    mismatched += sum(s, "kvferry_mismatched_bytes_total");
    local += sum(s, "kvferry_failures_total", {"origin_kind=\"local\""});
    propagated += sum(s, "kvferry_failures_total", {"origin_kind=\"propagated\""});
  }
  EXPECT_EQ(sent, r["bytes"]["transferred"].get<double>());
  EXPECT_EQ(verified, r["bytes"]["verified"].get<double>());
  EXPECT_EQ(mismatched, 0);
  // Each failed room has exactly one origin among the 4 ranks; the 3 others learned it.
  EXPECT_EQ(local, failed + rejected);
  EXPECT_EQ(propagated, 3 * (failed + rejected));

  // kvferry logs --json: one entry per failed room, naming the report's origin and code.
  const CliRun logs = run_cli({"logs", "--json", out().string()}, dir_ / "logs.txt");
  ASSERT_EQ(logs.exit_code, 0) << logs.output;
  const json rooms = json::parse(logs.output);
  std::map<std::string, json> by_room;
  for (const auto& f : rooms) by_room[f["room"]] = f;
  EXPECT_EQ(by_room.size(), failed + rejected) << logs.output;
  ASSERT_EQ(r["faults"].size(), failed);
  for (const auto& f : r["faults"]) {
    SCOPED_TRACE(f.dump());
    ASSERT_TRUE(by_room.count(f["room"]));
    const json& g = by_room[f["room"]];
    EXPECT_EQ(g["origin"], f["injected_at"]);
    EXPECT_EQ(g["code"], f["code"]);
    EXPECT_EQ(g["reason"], f["reason"]);
    ASSERT_EQ(g["ranks"].size(), 4u);
    EXPECT_EQ(g["ranks"][0], f["injected_at"]);  // causal order: the origin first
  }
  for (const auto& q : r["rejected_requests"]) {
    ASSERT_TRUE(by_room.count(q["room"]));
    EXPECT_EQ(by_room[q["room"]]["code"], "resource_exhausted");
    EXPECT_EQ(by_room[q["room"]]["origin"], "decode/tp0");
  }
  // --room: that room only, as text with its timeline.
  const std::string room = r["faults"][0]["room"];
  const CliRun one = run_cli({"logs", out().string(), "--room", room}, dir_ / "room.txt");
  EXPECT_EQ(one.exit_code, 0);
  EXPECT_NE(one.output.find("room " + room + ": "), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("timeline"), std::string::npos) << one.output;
  for (const auto& [other, f] : by_room)
    if (other != room) {
      EXPECT_EQ(one.output.find("room " + other + ": "), std::string::npos) << other;
    }
}

// Data parallelism: every rank of every DP group serves metrics on the port it bound itself, under
// its own name, and writes a final file named like its log file; the totals agree with the report.
TEST_F(Observability, EveryRankOfEveryDataParallelGroupHasMetrics) {
  // The last request arrives 3 s after the others (real time): the ranks serve metrics at least that
  // long, however fast the machine runs the rest.
  const fs::path trace = write_trace(8, 5, {600, 1500, 900, 1200}, 7, 3000);
  const pid_t pid = start_cli({"replay", "--trace", trace.string(), "--time-scale", "1", "--model", "Llama-3.1-8B",
                               "--prefill-tp", "1", "--prefill-dp", "2", "--decode-tp", "1", "--decode-dp", "2",
                               "--page-size", "16",
                               "--pool-mib", "384", "--prefill-pool-mib", "64", "--seed", "5", "--metrics",
                               "--out", out().string()},
                              dir_ / "output.txt");
  const std::map<std::string, std::string> files = {{"prefill/tp0", "prefill-tp0"},
                                                    {"prefill/tp0/dp1", "prefill-tp0-dp1"},
                                                    {"decode/tp0", "decode-tp0"},
                                                    {"decode/tp0/dp1", "decode-tp0-dp1"}};
  std::set<std::string> scraped;  // ranks that answered /metrics (under their own name) while it ran
  int rc = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      rc = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
      break;
    }
    json ports = json::parse(slurp(out() / "metrics.json"), nullptr, false);
    for (auto& [rank, m] : ports.is_object() ? ports.items() : json::object().items()) {
      if (scraped.count(rank) || !m["port"].is_number()) continue;
      httplib::Client c("127.0.0.1", m["port"].get<int>());
      c.set_connection_timeout(0, 200'000);
      auto res = c.Get("/metrics");
      if (res && res->status == 200 && res->body.find("rank=\"" + rank + "\"") != std::string::npos) {
        scraped.insert(rank);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(rc, 0) << slurp(dir_ / "output.txt");
  EXPECT_EQ(scraped.size(), 4u) << "not every rank of both DP groups was scraped while the replay ran";
  const json r = report();
  const json ports = json::parse(slurp(out() / "metrics.json"));
  ASSERT_EQ(ports.size(), files.size()) << ports.dump(2);
  const uint64_t ok = r["requests"]["succeeded"], failed = r["requests"]["failed"], rejected = r["requests"]["rejected"];
  EXPECT_EQ(ok, 8u);
  double sent = 0, verified = 0, prefill_rooms = 0, decode_rooms = 0;
  for (const auto& [rank, file] : files) {
    SCOPED_TRACE(rank);
    EXPECT_TRUE(scraped.count(rank));
    ASSERT_TRUE(ports.contains(rank));
    EXPECT_EQ(ports[rank]["final"], (out() / "metrics" / (file + ".prom")).string());
    EXPECT_EQ(ports[rank]["port_file"], (out() / "metrics" / (file + ".port")).string());
    const std::string text = slurp(out() / "metrics" / (file + ".prom"));
    EXPECT_NE(text.find("rank=\"" + rank + "\""), std::string::npos) << text;
    const auto s = samples(text);
    const double rooms = sum(s, "kvferry_rooms_total");
    EXPECT_GT(rooms, 0) << "both DP groups of each engine serve rooms";
    EXPECT_EQ(sum(s, "kvferry_rooms_total", {"outcome=\"failed\""}), 0);
    for (const char* leak : {"kvferry_live_rooms", "kvferry_registry_records", "kvferry_pages_in_use",
                             "kvferry_rooms_in_flight"})
      EXPECT_EQ(sum(s, leak), 0) << leak;
    (rank.rfind("prefill", 0) == 0 ? prefill_rooms : decode_rooms) += rooms;
    if (rank.rfind("decode", 0) == 0) {
      EXPECT_EQ(sum(s, "kvferry_sent_bytes_total"), 0);
    } else {
      EXPECT_EQ(sum(s, "kvferry_verified_bytes_total"), 0);
    }
    sent += sum(s, "kvferry_sent_bytes_total");
    verified += sum(s, "kvferry_verified_bytes_total");
  }
  // Each room is served by one group of each engine (TP 1): counted once over each engine's ranks.
  EXPECT_EQ(prefill_rooms, ok + failed + rejected);
  EXPECT_EQ(decode_rooms, ok + failed + rejected);
  EXPECT_EQ(sent, r["bytes"]["transferred"].get<double>());
  EXPECT_EQ(verified, r["bytes"]["verified"].get<double>());
  EXPECT_GT(verified, 0);
}

TEST_F(Observability, CtrlCStopsEveryProcessAndWritesAPartialReport) {
  const pid_t pid = start_cli({"replay", "--trace", kTrace, "--model", "Qwen2.5-7B", "--prefill-tp", "2",
                               "--decode-tp", "2", "--pool-mib", "1024", "--prefill-pool-mib", "256", "--page-size",
                               "16", "--max-requests", "300", "--progress-interval-s", "1", "--metrics",
                               "--out", out().string()},
                              dir_ / "output.txt");
  // Interrupt once some requests finished (the router's progress file says so) and the first
  // plain progress line was printed (it comes once per --progress-interval-s, so a fast machine
  // can finish three requests before it: wait for the event, not for a time).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  size_t finished = 0;
  bool progress_printed = false;
  while ((finished < 3 || !progress_printed) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    progress_printed = slurp(dir_ / "output.txt").find("requests done") != std::string::npos;
    json p = json::parse(slurp(out() / "results.json.progress"), nullptr, false);
    if (p.is_discarded()) continue;
    finished = 0;
    for (const auto& q : p["requests"]) finished += !q["decode"].is_null() && !q["prefill"].is_null();
  }
  ASSERT_GE(finished, 3u);
  ASSERT_TRUE(progress_printed) << slurp(dir_ / "output.txt");
  ASSERT_EQ(kill(pid, SIGINT), 0);
  const int rc = wait_exit(pid, std::chrono::seconds(30));
  const std::string output = slurp(dir_ / "output.txt");
  EXPECT_EQ(rc, 128 + SIGINT) << output;
  EXPECT_NE(output.find("requests done"), std::string::npos) << output;  // plain progress lines
  const json r = report();
  EXPECT_EQ(r["status"], "partial");
  EXPECT_EQ(r["partial"], true);
  EXPECT_NE(r["error"].get<std::string>().find("signal 2"), std::string::npos);
  EXPECT_EQ(r["requests"]["planned"], 300);
  EXPECT_GE(r["requests"]["total"].get<uint64_t>(), finished);
  EXPECT_LT(r["requests"]["total"].get<uint64_t>(), 300u);
  EXPECT_EQ(r["requests"]["total"].get<uint64_t>() + r["requests"]["unfinished"].get<uint64_t>(), 300u);
  EXPECT_GT(r["bytes"]["verified"].get<uint64_t>(), 0u);
  EXPECT_EQ(r["bytes"]["mismatched"], 0);
  EXPECT_EQ(r["logs"]["invalid_lines"], 0);  // every process flushed whole lines before exiting
  // Every rank stopped on its own (exit 128+SIGTERM) and still wrote its final metrics.
  for (const char* f : {"prefill-tp0", "prefill-tp1", "decode-tp0", "decode-tp1"})
    EXPECT_TRUE(fs::exists(out() / "metrics" / (std::string(f) + ".prom"))) << f;
  // No process of this replay is left (also checked for every test by TearDown).
  EXPECT_TRUE(processes_mentioning(dir_.string()).empty());
}

}  // namespace
}  // namespace kvferry_itest
