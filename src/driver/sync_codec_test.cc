// The engine's step frames (sync_codec.h): the fan-out's fail frame, the step's member list and
// the hi frame round-trip; malformed frames are rejected with kProtocolError, never thrown.
#include "driver/sync_codec.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvferry {
namespace {

SiblingFailure sample() {
  return {0xfedcba9876543210ull, 2, ErrorCode::kTransferError, "prefill/tp3", "write to decode/tp3 failed: \"x\"",
          123456789012345, 1764000000123456789};
}

TEST(SyncCodec, FailFrameRoundTrips) {
  SiblingFailure f = sample();
  auto d = decode_sync_frame(encode_fail(f));
  ASSERT_TRUE(d.ok()) << d.status().str();
  EXPECT_EQ(d->type, "fail");
  EXPECT_EQ(d->tp_rank, 2u);
  EXPECT_EQ(d->fail.room, f.room);
  EXPECT_EQ(d->fail.tp_rank, 2u);
  EXPECT_EQ(d->fail.code, ErrorCode::kTransferError);
  EXPECT_EQ(d->fail.origin, "prefill/tp3");
  EXPECT_EQ(d->fail.reason, f.reason);
  EXPECT_EQ(d->fail.first_seen_ns, f.first_seen_ns);
  EXPECT_EQ(d->fail.wall_ns, f.wall_ns);
  EXPECT_NE(encode_fail(f).find("\"code\":\"transfer_error\""), std::string::npos);  // the shared codec
}

TEST(SyncCodec, ReleaseCarriesTheEnginesRootCause) {
  Decision rel;
  rel.op = Decision::Op::kRelease;
  rel.room = 9;
  set_failure(rel, Failure{ErrorCode::kWaitingTimeout, RankId{Role::kDecode, 0, 1, 0}, "late", 5, 6});
  auto d = decode_sync_frame(encode_step(1, false, {rel}));
  ASSERT_TRUE(d.ok()) << d.status().str();
  ASSERT_EQ(d->decisions.size(), 1u);
  EXPECT_EQ(failure_of(d->decisions[0]), failure_of(rel));
  Decision ok_rel;
  ok_rel.op = Decision::Op::kRelease;
  auto d2 = decode_sync_frame(encode_step(2, false, {ok_rel}));
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->decisions[0].code, ErrorCode::kOk);
}

TEST(SyncCodec, NewRoomCarriesItsTypedFault) {
  Decision n;
  n.op = Decision::Op::kNew;
  n.room = 11;
  n.request.room = 11;
  n.request.input_tokens = 300;
  n.request.fault = fault_from_names("timeout", "decode/tp1/dp1");
  auto d = decode_sync_frame(encode_step(1, false, {n}));
  ASSERT_TRUE(d.ok()) << d.status().str();
  ASSERT_EQ(d->decisions.size(), 1u);
  EXPECT_EQ(d->decisions[0].request.input_tokens, 300u);
  EXPECT_EQ(d->decisions[0].request.fault, n.request.fault);
  n.request.fault.reset();
  d = decode_sync_frame(encode_step(2, false, {n}));
  ASSERT_TRUE(d.ok()) << d.status().str();
  EXPECT_FALSE(d->decisions[0].request.fault.has_value());
  // A fault the engine cannot act on is a malformed step, not an exception.
  std::string bad = encode_step(3, false, {n});
  bad.replace(bad.find("\"room\":\"11\""), 11, R"("fault":{"kind":"boom","at":"decode/tp1"},"room":"11")");
  EXPECT_EQ(decode_sync_frame(bad).status().code(), ErrorCode::kProtocolError) << bad;
}

TEST(SyncCodec, StepCarriesMembersOnlyWhenGiven) {
  Decision fail;
  fail.op = Decision::Op::kFail;
  fail.room = 7;
  fail.code = ErrorCode::kAborted;
  fail.origin = "decode/tp0";
  fail.reason = "aborted by the router";
  fail.first_seen_ns = 42;
  auto plain = decode_sync_frame(encode_step(5, false, {fail}));
  ASSERT_TRUE(plain.ok()) << plain.status().str();
  EXPECT_FALSE(plain->has_members);
  EXPECT_TRUE(plain->members.empty());
  ASSERT_EQ(plain->decisions.size(), 1u);
  EXPECT_EQ(plain->decisions[0].origin, "decode/tp0");

  std::vector<EngineMember> members{{1, "tcp://127.0.0.1:4001"}, {3, "tcp://127.0.0.1:4003"}};
  auto with = decode_sync_frame(encode_step(6, true, {}, &members));
  ASSERT_TRUE(with.ok()) << with.status().str();
  EXPECT_EQ(with->seq, 6u);
  EXPECT_TRUE(with->shutdown);
  EXPECT_TRUE(with->has_members);
  ASSERT_EQ(with->members.size(), 2u);
  EXPECT_EQ(with->members[0].tp_rank, 1u);
  EXPECT_EQ(with->members[0].endpoint, "tcp://127.0.0.1:4001");
  EXPECT_EQ(with->members[1].tp_rank, 3u);
  EXPECT_EQ(with->members[1].endpoint, "tcp://127.0.0.1:4003");

  std::vector<EngineMember> none;  // every follower is down: an empty list is still a change
  auto empty = decode_sync_frame(encode_step(7, false, {}, &none));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->has_members);
  EXPECT_TRUE(empty->members.empty());
}

TEST(SyncCodec, StepCarriesLeaveOnlyWhenSet) {
  auto plain = decode_sync_frame(encode_step(4, true, {}));
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->shutdown);
  EXPECT_FALSE(plain->leave);
  EXPECT_EQ(encode_step(4, true, {}).find("leave"), std::string::npos);
  auto leave = decode_sync_frame(encode_step(5, true, {}, nullptr, true));
  ASSERT_TRUE(leave.ok());
  EXPECT_TRUE(leave->shutdown);
  EXPECT_TRUE(leave->leave);
  EXPECT_FALSE(decode_sync_frame(R"({"type":"step","seq":1,"shutdown":true,"leave":"yes","decisions":[]})").ok());
}

TEST(SyncCodec, HiRoundTrips) {
  auto d = decode_sync_frame(encode_hi(3));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->type, "hi");
  EXPECT_EQ(d->tp_rank, 3u);
}

// Found by fuzz/engine_sync_fuzz.cc (UBSan): an integer too large for 64 bits is kept as a double
// by the JSON parser, and converting it to an integer field was undefined behaviour. Any
// non-integer number is now refused as a protocol error.
TEST(SyncCodec, NumbersThatAreNotIntegersAreRefused) {
  const std::string found = R"({"decisions":[{"arrival_ms":7,"0ault":{"at":"prefill/tp1","kind":"transfer"},"input_tokens":19999999999999999999999999999999999999999999999999999999999999900,"op":0,"oson":"write failed","room":"43","wall_ns":20},{"op":4,"quarst_seen_nrue,firsm":"43"}],"members":[{"endpoint":"tcp://127.0.0.1:6000","tp":0},{"endpoint":"tcp://127.0.0.1:6001","tp":1}],"seq":3,"shutdown":false,"type":"step"})";
  auto d = decode_sync_frame(found);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kProtocolError);
  EXPECT_FALSE(decode_sync_frame(R"({"type":"hi","tp_rank":3.0})").ok());
  EXPECT_FALSE(decode_sync_frame(R"({"type":"hi","tp_rank":1e300})").ok());
  auto ok = decode_sync_frame(R"({"type":"hi","tp_rank":3})");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->tp_rank, 3u);
}

TEST(SyncCodec, DownRoundTripsAndRejectsAMissingOrHugeReason) {
  auto d = decode_sync_frame(encode_down("prefill/tp1 stopped answering for 2400 ms"));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->type, "down");
  EXPECT_EQ(d->reason, "prefill/tp1 stopped answering for 2400 ms");
  EXPECT_FALSE(decode_sync_frame(R"({"type":"down"})").ok());
  EXPECT_FALSE(decode_sync_frame(encode_down(std::string(5000, 'x'))).ok());
}

// The quarantine's end: a rank reports a reclaimed quarantined room in its reply in a short form
// (room and rank only), beside its live rooms; the leader's kReclaim carries the room only; the
// reply's stats carry the reclaimed pages.
TEST(SyncCodec, ReclaimReportsAndDecisionsRoundTrip) {
  RoomReport live;
  live.room = 0x77;
  live.tp_rank = 1;
  live.poll = KVPoll::Transferring;
  RoomReport back;
  back.room = 0xfedcba9876543210ull;
  back.tp_rank = 1;
  back.reclaimed = true;
  back.poll = KVPoll::Failed;  // not sent: a reclaim report carries nothing but room and rank
  back.verified = 99;
  RankLeakStats st{"decode/tp1", 1, 0, 3, 1};
  st.quarantined_pages = 4;
  st.reclaimed_pages = 9;
  const std::string text = encode_reply(5, 1, {live, back}, st);
  EXPECT_NE(text.find(R"({"reclaimed":true,"room":"18364758544493064720","tp":1})"), std::string::npos) << text;
  auto f = decode_sync_frame(text);
  ASSERT_TRUE(f.ok()) << f.status().str();
  ASSERT_EQ(f->rooms.size(), 2u);
  EXPECT_FALSE(f->rooms[0].reclaimed);
  EXPECT_EQ(f->rooms[0].poll, KVPoll::Transferring);
  EXPECT_TRUE(f->rooms[1].reclaimed);
  EXPECT_EQ(f->rooms[1].room, back.room);
  EXPECT_EQ(f->rooms[1].tp_rank, 1u);
  EXPECT_EQ(f->rooms[1].verified, 0u);
  EXPECT_EQ(f->stats.quarantined_pages, 4u);
  EXPECT_EQ(f->stats.reclaimed_pages, 9u);
  EXPECT_EQ(f->rooms[0].compute_end_ns, 0);
  live.compute_end_ns = 4242;  // a prefill room's last layer's compute (the compute model)
  auto lf = decode_sync_frame(encode_reply(7, 1, {live}, st));
  ASSERT_TRUE(lf.ok()) << lf.status().str();
  EXPECT_EQ(lf->rooms[0].compute_end_ns, 4242);

  Decision rc;
  rc.op = Decision::Op::kReclaim;
  rc.room = back.room;
  const std::string step = encode_step(6, false, {rc});
  EXPECT_NE(step.find(R"({"op":5,"room":"18364758544493064720"})"), std::string::npos) << step;
  auto d = decode_sync_frame(step);
  ASSERT_TRUE(d.ok()) << d.status().str();
  ASSERT_EQ(d->decisions.size(), 1u);
  EXPECT_EQ(d->decisions[0].op, Decision::Op::kReclaim);
  EXPECT_EQ(d->decisions[0].room, back.room);

  // Malformed: an op past kReclaim, a reclaim flag that is false or not a bool, a reclaim
  // report without its rank.
  for (const std::string& bad :
       {std::string(R"({"type":"step","seq":1,"shutdown":false,"decisions":[{"op":6,"room":"1"}]})"),
        std::string(R"({"type":"reply","seq":1,"tp_rank":1,"rooms":[{"room":"1","tp":1,"reclaimed":false}],"stats":{"rank":"decode/tp1","live_rooms":0,"records":0,"pages_in_use":0,"peers":0}})"),
        std::string(R"({"type":"reply","seq":1,"tp_rank":1,"rooms":[{"room":"1","tp":1,"reclaimed":1}],"stats":{"rank":"decode/tp1","live_rooms":0,"records":0,"pages_in_use":0,"peers":0}})"),
        std::string(R"({"type":"reply","seq":1,"tp_rank":1,"rooms":[{"room":"1","reclaimed":true}],"stats":{"rank":"decode/tp1","live_rooms":0,"records":0,"pages_in_use":0,"peers":0}})")}) {
    auto r = decode_sync_frame(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kProtocolError) << bad;
  }
}

// Each malformed frame is rejected with kProtocolError and a message naming the problem.
TEST(SyncCodec, MalformedFailFramesAreRejected) {
  const std::string ok = encode_fail(sample());
  ASSERT_TRUE(decode_sync_frame(ok).ok());
  auto mutate = [&](const std::string& from, const std::string& to) {
    std::string s = ok;
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  struct Case {
    std::string name, frame, says;
  };
  const std::vector<Case> cases{
      {"not json", "{\"type\":\"fail\",", "bad engine frame"},
      {"unknown code", mutate("\"code\":\"transfer_error\"", "\"code\":\"nope\""), "fail.code: 'nope' is not a failure code"},
      {"code ok is not a failure", mutate("\"code\":\"transfer_error\"", "\"code\":\"ok\""), "is not a failure code"},
      {"code as a number", mutate("\"code\":\"transfer_error\"", "\"code\":1"), "fail.code: not a string"},
      {"origin not a rank", mutate("\"origin\":\"prefill/tp3\"", "\"origin\":\"somewhere\""), "is not a rank"},
      {"negative first_seen_ns", mutate("\"first_seen_ns\":123456789012345", "\"first_seen_ns\":-1"),
       "fail.first_seen_ns: negative"},
      {"room missing", mutate("\"room\":", "\"rooom\":"), "room"},
      {"room not a number", mutate("\"room\":\"18364758544493064720\"", "\"room\":\"abc\""), "bad engine frame"},
      {"reason of the wrong type", mutate("\"reason\":\"", "\"reason\":5,\"x\":\""), "bad engine frame"},
      {"tp_rank missing", mutate("\"tp_rank\":2", "\"tp\":2"), "tp_rank"},
  };
  for (const Case& c : cases) {
    auto d = decode_sync_frame(c.frame);
    ASSERT_FALSE(d.ok()) << c.name << ": " << c.frame;
    EXPECT_EQ(d.status().code(), ErrorCode::kProtocolError) << c.name;
    EXPECT_NE(d.status().message().find(c.says), std::string::npos) << c.name << ": " << d.status().str();
  }
}

TEST(SyncCodec, MalformedMembersAreRejected) {
  for (const std::string& members : {std::string(R"([{"tp":1,"endpoint":""}])"),
                                     std::string(R"([{"endpoint":"tcp://a:1"}])"), std::string(R"({"tp":1})")}) {
    std::string frame = R"({"type":"step","seq":1,"shutdown":false,"decisions":[],"members":)" + members + "}";
    auto d = decode_sync_frame(frame);
    ASSERT_FALSE(d.ok()) << frame;
    EXPECT_EQ(d.status().code(), ErrorCode::kProtocolError) << frame;
  }
}

}  // namespace
}  // namespace kvferry

namespace kvferry {
namespace {

// xPyD: the chosen prefill instance's bootstrap service reaches every rank of the decode engine.
TEST(SyncCodec, NewRoomCarriesItsPrefillBootstrap) {
  Decision n;
  n.op = Decision::Op::kNew;
  n.room = 12;
  n.request.room = 12;
  n.request.input_tokens = 30;
  n.request.prefill_bootstrap = "127.0.0.1:4242";
  auto d = decode_sync_frame(encode_step(1, false, {n}));
  ASSERT_TRUE(d.ok()) << d.status().str();
  EXPECT_EQ(d->decisions[0].request.prefill_bootstrap, "127.0.0.1:4242");
  n.request.prefill_bootstrap.clear();
  d = decode_sync_frame(encode_step(2, false, {n}));
  ASSERT_TRUE(d.ok()) << d.status().str();
  EXPECT_TRUE(d->decisions[0].request.prefill_bootstrap.empty());
  n.request.prefill_bootstrap = std::string(256, 'x');  // over the bound: a malformed step
  EXPECT_EQ(decode_sync_frame(encode_step(3, false, {n})).status().code(), ErrorCode::kProtocolError);
}

}  // namespace
}  // namespace kvferry
