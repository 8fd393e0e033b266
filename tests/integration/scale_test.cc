// `kvferry replay --scale` (docs/report.md "Scaling while serving"): a prefill instance joins and
// a decode instance is drained and removed while the trace is served. Checked by events only:
//   - the replay exits 0, no room failed, report.json has no problem;
//   - the joined prefill instance is ready, and got rooms (results.json: prefill_instance 1) once a
//     request was dispatched after its ready (the report's rooms and first_room_ms agree);
//   - the drained decode instance got no request dispatched after its event, left (its final
//     stats arrived), and its ranks logged their orderly leave;
//   - no log line above info is a peer_dead event (its peers forgot it without a failure).
#include <fstream>
#include <set>

#include "replay_harness.h"

namespace kvferry_itest {
namespace {

class Scale : public ReplayDir {};

TEST_F(Scale, PrefillJoinsAndDecodeLeavesWithoutAFailedRoom) {
  // 40 requests 200 ms apart: about 8 s of trace around the events at 2 s and 4 s.
  const fs::path trace = write_trace(40, 200, {600, 1500, 900, 1200});
  const CliRun run = replay({"--trace", trace.string(), "--model", "Llama-3.1-8B", "--prefill-instances", "1",
                             "--decode-instances", "2", "--scale", "t=2s:+prefill,t=4s:-decode", "--time-scale",
                             "1", "--page-size", "16", "--pool-mib", "256", "--prefill-pool-mib", "64",
                             "--max-inflight", "8", "--transport", "tcp", "--seed", "3"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json r = report();
  ASSERT_EQ(r["status"], "ok") << r["error"];
  EXPECT_TRUE(r["problems"].empty()) << r["problems"].dump();
  EXPECT_EQ(r["requests"]["failed"], 0);
  EXPECT_EQ(r["config"]["scale"], "t=2s:+prefill,t=4s:-decode");
  ASSERT_EQ(r["scale_events"].size(), 2u) << r.dump();
  const json& join = r["scale_events"][0];
  EXPECT_EQ(join["action"], "join");
  EXPECT_EQ(join["role"], "prefill");
  EXPECT_EQ(join["instance"], 1);
  EXPECT_TRUE(join["ready_ms"].is_number()) << join.dump();
  EXPECT_EQ(join["failed_rooms_caused"], 0);
  const json& leave = r["scale_events"][1];
  EXPECT_EQ(leave["action"], "leave");
  EXPECT_EQ(leave["role"], "decode");
  EXPECT_EQ(leave["instance"], 1);
  EXPECT_TRUE(leave["drained_ms"].is_number()) << leave.dump();
  EXPECT_EQ(leave["rooms"], 0);
  EXPECT_EQ(leave["failed_rooms_caused"], 0);
  EXPECT_EQ(leave["peer_dead_lines"], 0);
  EXPECT_NE(run.output.find("scale events:"), std::string::npos) << run.output;

  // The router's own record: nothing went to decode instance 1 after its event; prefill 1 served.
  const json res = results();
  ASSERT_EQ(res["scale"].size(), 2u);
  const int64_t leave_ns = res["scale"][1]["event_ns"].get<int64_t>();
  const int64_t joined_ns = res["scale"][0]["ready_ns"].get<int64_t>();
  size_t joined_rooms = 0, decode1_before = 0, after_join = 0;
  for (const auto& q : res["requests"]) {
    joined_rooms += q.value("prefill_instance", 0u) == 1 ? 1 : 0;
    after_join += q["dispatched_ns"].get<int64_t>() > joined_ns ? 1 : 0;
    if (q.value("decode_instance", 0u) != 1) continue;
    EXPECT_LT(q["dispatched_ns"].get<int64_t>(), leave_ns) << q.dump();
    ++decode1_before;
  }
  // The first request after the join goes to it (no request yet: the least recently chosen). On a
  // host so slow that the join was ready only after the last dispatch there is none.
  EXPECT_EQ(after_join > 0, joined_rooms > 0) << after_join << " requests after the join";
  EXPECT_EQ(join["rooms"].get<size_t>(), joined_rooms);
  EXPECT_EQ(join["first_room_ms"].is_number(), joined_rooms > 0) << join.dump();
  EXPECT_GT(decode1_before, 0u) << "decode instance 1 served rooms before it left";

  // Every log: no peer_dead line above info; decode instance 1's ranks left in order.
  bool left_in_order = false;
  for (const auto& f : fs::directory_iterator(out() / "logs")) {
    if (f.path().extension() != ".jsonl") continue;
    std::ifstream in(f.path());
    for (std::string line; std::getline(in, line);) {
      const json l = json::parse(line, nullptr, false);
      if (!l.is_object()) continue;
      const std::string level = l.value("level", "");
      if (l.value("event", "") == "peer_dead") {
        EXPECT_TRUE(level == "debug" || level == "info" || level == "trace") << f.path() << ": " << line;
      }
      if (f.path().filename().string().rfind("decode1", 0) == 0 &&
          l.value("msg", "").find("left in order") != std::string::npos) {
        left_in_order = true;
      }
    }
  }
  EXPECT_TRUE(left_in_order) << "no 'left in order' line in decode instance 1's logs";
}

TEST_F(Scale, RefusesToRemoveTheLastInstance) {
  const fs::path trace = write_trace(4, 10, {600});
  const CliRun run = replay({"--trace", trace.string(), "--model", "Llama-3.1-8B", "--scale", "t=1s:-decode"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("last live decode instance"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace kvferry_itest
