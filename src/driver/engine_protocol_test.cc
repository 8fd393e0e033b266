#include "driver/engine_protocol.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

TEST(RouterProtocol, RequestRoundTripWithFault) {
  RouterRequest q;
  q.room = 0x7fffffffffffffffULL;
  q.input_tokens = 12345;
  q.output_tokens = 17;
  q.arrival_ms = 9000;
  q.fault = *fault_from_names("transfer", "prefill/tp1");
  const std::string text = encode_request(q);
  EXPECT_NE(text.find("\"room\":\"9223372036854775807\""), std::string::npos) << text;
  auto f = decode_router_frame(text);
  ASSERT_TRUE(f.ok()) << f.status().str();
  EXPECT_EQ(f->type, "request");
  ASSERT_TRUE(f->request.has_value());
  EXPECT_FALSE(f->result.has_value());
  EXPECT_EQ(f->request->room, q.room);
  EXPECT_EQ(f->request->input_tokens, 12345u);
  EXPECT_EQ(f->request->output_tokens, 17u);
  EXPECT_EQ(f->request->arrival_ms, 9000u);
  ASSERT_TRUE(f->request->fault.has_value());
  EXPECT_EQ(f->request->fault->kind, FaultKind::kTransfer);
  EXPECT_EQ(f->request->fault->at.str(), "prefill/tp1");
}

TEST(RouterProtocol, TimeoutFaultsReachTheEnginesAbortsAndPeerDeathsDoNot) {
  RouterRequest q;
  q.room = 5;
  q.input_tokens = 10;
  q.fault = *fault_from_names("timeout", "decode/tp1");
  auto f = decode_router_frame(encode_request(q));
  ASSERT_TRUE(f.ok()) << f.status().str();
  EXPECT_EQ(f->request->fault->kind, FaultKind::kTimeout);
  q.fault = *fault_from_names("prefill_fail", "prefill/tp3/dp1");
  f = decode_router_frame(encode_request(q));
  ASSERT_TRUE(f.ok()) << f.status().str();
  EXPECT_EQ(f->request->fault->kind, FaultKind::kPrefillFail);
  EXPECT_EQ(f->request->fault->at.str(), "prefill/tp3/dp1");
  q.fault = *fault_from_names("abort", "decode/tp0");  // the router acts on it, never sends it
  EXPECT_FALSE(decode_router_frame(encode_request(q)).ok());
  EXPECT_FALSE(decode_router_frame(R"({"type":"request","room":"5","input_tokens":10,"output_tokens":1,)"
                                   R"("arrival_ms":0,"fault":{"kind":"peer_death","at":"decode/tp0"}})")
                   .ok());
}

TEST(RouterProtocol, AbortFrames) {
  EXPECT_EQ(encode_abort(123), R"({"room":"123","type":"abort"})");
  auto a = decode_router_frame(encode_abort(9223372036854775807ULL));
  ASSERT_TRUE(a.ok()) << a.status().str();
  EXPECT_EQ(a->type, "abort");
  EXPECT_EQ(a->abort_room, 9223372036854775807ULL);
  EXPECT_FALSE(decode_router_frame(R"({"type":"kill","rank":"prefill/tp1"})").ok());  // replay's, not the engines'
  EXPECT_FALSE(decode_router_frame(R"({"type":"abort","room":"x"})").ok());
}

TEST(RouterProtocol, FaultKindsByName) {
  for (FaultKind k : {FaultKind::kTransfer, FaultKind::kDecodeFail, FaultKind::kPrefillFail, FaultKind::kTimeout,
                      FaultKind::kAbort}) {
    EXPECT_EQ(fault_kind_from_name(fault_kind_name(k)), k);
  }
  EXPECT_EQ(fault_kind_name(FaultKind::kDecodeFail), "decode_fail");
  EXPECT_FALSE(fault_kind_from_name("peer_death").has_value());
  EXPECT_FALSE(fault_kind_from_name("").has_value());
  auto f = fault_from_names("timeout", "decode/tp1/dp2");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->kind, FaultKind::kTimeout);
  EXPECT_EQ(f->at, (RankId{Role::kDecode, 0, 1, 2}));
  EXPECT_EQ(f->str(), "timeout@decode/tp1/dp2");
  EXPECT_FALSE(fault_from_names("boom", "decode/tp1").has_value());
  EXPECT_FALSE(fault_from_names("timeout", "decode").has_value());
}

TEST(RouterProtocol, RequestWithoutFault) {
  RouterRequest q;
  q.room = 0;
  q.input_tokens = 1;
  auto f = decode_router_frame(encode_request(q));
  ASSERT_TRUE(f.ok()) << f.status().str();
  EXPECT_EQ(f->request->room, 0u);
  EXPECT_FALSE(f->request->fault.has_value());
}

TEST(RouterProtocol, ResultRoundTrip) {
  RoomResult r;
  r.role = Role::kDecode;
  r.room = 42;
  r.state = KVPoll::Failed;
  r.rejected = true;
  r.code = ErrorCode::kResourceExhausted;
  r.origin = "decode/tp0";
  r.reason = "needs 300 pages, pool has 200";
  r.first_send_ns = -5;
  r.success_ns = 7;
  r.failed_all_ns = 123456789012345;
  r.first_failed_ns = 123456789000000;
  r.bytes_transferred = 1ULL << 40;
  r.bytes_verified = 3;
  r.bytes_mismatched = 2;
  r.ranks_failed = 2;
  auto f = decode_router_frame(encode_result(r));
  ASSERT_TRUE(f.ok()) << f.status().str();
  ASSERT_TRUE(f->result.has_value());
  const RoomResult& d = *f->result;
  EXPECT_EQ(d.role, Role::kDecode);
  EXPECT_EQ(d.room, 42u);
  EXPECT_EQ(d.state, KVPoll::Failed);
  EXPECT_TRUE(d.rejected);
  EXPECT_EQ(d.code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(d.origin, "decode/tp0");
  EXPECT_EQ(d.reason, r.reason);
  EXPECT_EQ(d.first_send_ns, -5);
  EXPECT_EQ(d.success_ns, 7);
  EXPECT_EQ(d.failed_all_ns, 123456789012345);
  EXPECT_EQ(d.first_failed_ns, 123456789000000);
  EXPECT_EQ(d.bytes_transferred, 1ULL << 40);
  EXPECT_EQ(d.bytes_verified, 3u);
  EXPECT_EQ(d.bytes_mismatched, 2u);
  EXPECT_EQ(d.ranks_failed, 2u);
  EXPECT_EQ(d.compute_end_ns, 0) << "no compute model";
  EXPECT_EQ(encode_result(r).find("compute_end_ns"), std::string::npos) << "absent unless set";
  r.compute_end_ns = 987654321;  // the prefill compute model's last layer end
  auto g = decode_router_frame(encode_result(r));
  ASSERT_TRUE(g.ok()) << g.status().str();
  EXPECT_EQ(g->result->compute_end_ns, 987654321);
}

TEST(RouterProtocol, RankUp) {
  auto r = decode_router_frame(encode_rank_up(RankId{Role::kDecode, 0, 1, 2}));
  ASSERT_TRUE(r.ok()) << r.status().str();
  EXPECT_EQ(r->type, "rank_up");
  ASSERT_TRUE(r->up_rank.has_value());
  EXPECT_EQ(r->up_rank->str(), "decode/tp1/dp2");
  EXPECT_FALSE(decode_router_frame(R"({"type":"rank_up"})").ok());
  EXPECT_FALSE(decode_router_frame(R"({"type":"rank_up","rank":7})").ok());
  EXPECT_FALSE(decode_router_frame(R"({"type":"rank_up","rank":"router/tp1"})").ok());
}

TEST(RouterProtocol, ReadyShutdownStats) {
  auto r = decode_router_frame(encode_ready(Role::kDecode, 4));
  ASSERT_TRUE(r.ok()) << r.status().str();
  EXPECT_EQ(r->type, "ready");
  ASSERT_TRUE(r->ready_role.has_value());
  EXPECT_EQ(*r->ready_role, Role::kDecode);
  EXPECT_EQ(r->ready_tp_size, 4u);
  EXPECT_EQ(r->dp_rank, 0u);
  EXPECT_EQ(r->ready_endpoint, "");

  // A DP group's leader names its group and its engine endpoint.
  auto g = decode_router_frame(encode_ready(Role::kPrefill, 2, 3, "tcp://127.0.0.1:4242"));
  ASSERT_TRUE(g.ok()) << g.status().str();
  EXPECT_EQ(g->dp_rank, 3u);
  EXPECT_EQ(g->ready_endpoint, "tcp://127.0.0.1:4242");
  EXPECT_FALSE(decode_router_frame(R"({"type":"ready","role":"decode","tp_size":1,"dp_rank":-1})").ok());
  EXPECT_FALSE(decode_router_frame(R"({"type":"ready","role":"decode","tp_size":1,"endpoint":5})").ok());
  auto gs = decode_router_frame(encode_stats(Role::kDecode, {}, 2));
  ASSERT_TRUE(gs.ok()) << gs.status().str();
  EXPECT_EQ(gs->dp_rank, 2u);

  auto s = decode_router_frame(encode_shutdown());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->type, "shutdown");
  auto lv = decode_router_frame(encode_leave());
  ASSERT_TRUE(lv.ok());
  EXPECT_EQ(lv->type, "leave");

  std::vector<RankLeakStats> ranks = {{"prefill/tp0", 1, 2, 3, 4}, {"prefill/tp1", 0, 0, 0, 1}};
  auto st = decode_router_frame(encode_stats(Role::kPrefill, ranks));
  ASSERT_TRUE(st.ok()) << st.status().str();
  EXPECT_EQ(st->stats_role, Role::kPrefill);
  ASSERT_TRUE(st->stats.has_value());
  ASSERT_EQ(st->stats->size(), 2u);
  EXPECT_EQ((*st->stats)[0].rank, "prefill/tp0");
  EXPECT_EQ((*st->stats)[0].live_rooms, 1u);
  EXPECT_EQ((*st->stats)[0].records, 2u);
  EXPECT_EQ((*st->stats)[0].pages_in_use, 3u);
  EXPECT_EQ((*st->stats)[0].peers, 4u);
  EXPECT_EQ((*st->stats)[1].peers, 1u);
}

// A decode rank's quarantine counters: what is still quarantined and what was reclaimed so far,
// both in the stats frame; a frame without them (an older rank) reads 0.
TEST(RouterProtocol, StatsCarryQuarantinedAndReclaimedPages) {
  RankLeakStats d{"decode/tp1", 0, 0, 0, 1};
  d.quarantined_pages = 7;
  d.reclaimed_pages = 12;
  auto st = decode_router_frame(encode_stats(Role::kDecode, {d}));
  ASSERT_TRUE(st.ok()) << st.status().str();
  ASSERT_EQ(st->stats->size(), 1u);
  EXPECT_EQ((*st->stats)[0].quarantined_pages, 7u);
  EXPECT_EQ((*st->stats)[0].reclaimed_pages, 12u);
  auto old = decode_router_frame(
      R"({"type":"stats","role":"decode","ranks":[{"rank":"decode/tp0","live_rooms":0,"records":0,"pages_in_use":0,"peers":1}]})");
  ASSERT_TRUE(old.ok()) << old.status().str();
  EXPECT_EQ((*old->stats)[0].quarantined_pages, 0u);
  EXPECT_EQ((*old->stats)[0].reclaimed_pages, 0u);
  EXPECT_FALSE(decode_router_frame(
                   R"({"type":"stats","role":"decode","ranks":[{"rank":"decode/tp0","live_rooms":0,"records":0,"pages_in_use":0,"peers":1,"reclaimed_pages":-3}]})")
                   .ok());
}

TEST(RouterProtocol, InvalidUtf8ReasonStillEncodes) {
  RoomResult r;
  r.state = KVPoll::Failed;
  r.code = ErrorCode::kInternal;
  r.reason = std::string("bad \xff byte");
  auto f = decode_router_frame(encode_result(r));
  ASSERT_TRUE(f.ok()) << f.status().str();
  EXPECT_NE(f->result->reason.find("bad "), std::string::npos);
}

void expect_rejected(const std::string& text, const std::string& needle) {
  auto f = decode_router_frame(text);
  ASSERT_FALSE(f.ok()) << text;
  EXPECT_EQ(f.status().code(), ErrorCode::kProtocolError) << text;
  EXPECT_NE(f.status().message().find(needle), std::string::npos)
      << text << " -> " << f.status().message();
}

TEST(RouterProtocol, RejectsBadFrames) {
  expect_rejected("", "not valid JSON");
  expect_rejected("{\"type\":", "not valid JSON");
  expect_rejected("[1,2]", "not a JSON object");
  expect_rejected("{}", "type");
  expect_rejected("{\"type\":7}", "type");
  expect_rejected("{\"type\":\"hello\"}", "unknown type");
  const std::string ok_req =
      R"({"type":"request","room":"5","input_tokens":10,"output_tokens":1,"arrival_ms":0,"fault":null})";
  ASSERT_TRUE(decode_router_frame(ok_req).ok());
  expect_rejected(R"({"type":"request","room":5,"input_tokens":10,"output_tokens":1,"arrival_ms":0,"fault":null})",
                  "room");
  expect_rejected(R"({"type":"request","room":"-5","input_tokens":10,"output_tokens":1,"arrival_ms":0,"fault":null})",
                  "room");
  expect_rejected(R"({"type":"request","room":"18446744073709551616","input_tokens":10,"output_tokens":1,"arrival_ms":0,"fault":null})",
                  "room");
  expect_rejected(R"({"type":"request","room":"05","input_tokens":10,"output_tokens":1,"arrival_ms":0,"fault":null})",
                  "room");
  expect_rejected(R"({"type":"request","room":"5","input_tokens":-1,"output_tokens":1,"arrival_ms":0,"fault":null})",
                  "input_tokens");
  expect_rejected(R"({"type":"request","room":"5","input_tokens":0,"output_tokens":1,"arrival_ms":0,"fault":null})",
                  "input_tokens");
  expect_rejected(R"({"type":"request","room":"5","input_tokens":10,"output_tokens":1,"arrival_ms":0})",
                  "fault");
  expect_rejected(R"({"type":"request","room":"5","input_tokens":10,"output_tokens":1,"arrival_ms":0,"fault":{"kind":"boom","at":"prefill/tp0"}})",
                  "kind");
  expect_rejected(R"({"type":"request","room":"5","input_tokens":10,"output_tokens":1,"arrival_ms":0,"fault":{"kind":"transfer","at":"nowhere"}})",
                  "at");
  expect_rejected(R"({"type":"ready","role":"middle","tp_size":2})", "role");
  expect_rejected(R"({"type":"ready","role":"decode","tp_size":0})", "tp_size");
  expect_rejected(R"({"type":"stats","role":"decode","ranks":{}})", "ranks");
  expect_rejected(R"({"type":"stats","role":"decode","ranks":[{"rank":"decode/tp0"}]})", "live_rooms");
}

TEST(RouterProtocol, RejectsInconsistentResults) {
  RoomResult r;
  r.room = 9;
  r.state = KVPoll::Success;
  r.code = ErrorCode::kOk;
  std::string good = encode_result(r);
  ASSERT_TRUE(decode_router_frame(good).ok());
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  expect_rejected(replace(good, "\"code\":\"ok\"", "\"code\":\"transfer_error\""), "code ok");
  expect_rejected(replace(good, "\"state\":\"Success\"", "\"state\":\"Failed\""), "failure code");
  expect_rejected(replace(good, "\"state\":\"Success\"", "\"state\":\"Transferring\""), "state");
  expect_rejected(replace(good, "\"code\":\"ok\"", "\"code\":\"nope\""), "unknown code");
  expect_rejected(replace(good, "\"origin\":\"\"", "\"origin\":\"x/tp\""), "origin");
  expect_rejected(replace(good, "\"rejected\":false", "\"rejected\":true"), "rejected");
  expect_rejected(replace(good, "\"ranks_failed\":0", "\"ranks_failed\":4294967296"), "ranks_failed");
  expect_rejected(replace(good, "\"success_ns\":0", "\"success_ns\":1.5"), "success_ns");
}

}  // namespace
}  // namespace kvferry

namespace kvferry {
namespace {

// xPyD: a request names the prefill instance's bootstrap service; ready and stats their instance.
TEST(RouterProtocol, InstancesAndPrefillBootstrap) {
  RouterRequest q;
  q.room = 5;
  q.input_tokens = 10;
  q.prefill_bootstrap = "10.0.0.2:8998";
  auto f = decode_router_frame(encode_request(q));
  ASSERT_TRUE(f.ok()) << f.status().str();
  EXPECT_EQ(f->request->prefill_bootstrap, "10.0.0.2:8998");
  q.prefill_bootstrap.clear();
  EXPECT_EQ(encode_request(q).find("bootstrap"), std::string::npos) << "absent when not chosen";
  for (const char* bad : {R"("bootstrap":"")", R"("bootstrap":7)"}) {
    std::string text = encode_request(q);
    text.insert(text.size() - 1, std::string(",") + bad);
    EXPECT_EQ(decode_router_frame(text).status().code(), ErrorCode::kProtocolError) << text;
  }
  auto r = decode_router_frame(encode_ready(Role::kDecode, 2, 1, "tcp://h:1", 3));
  ASSERT_TRUE(r.ok()) << r.status().str();
  EXPECT_EQ(r->instance, 3u);
  EXPECT_EQ(r->dp_rank, 1u);
  EXPECT_EQ(encode_ready(Role::kDecode, 2).find("instance"), std::string::npos);
  auto s = decode_router_frame(encode_stats(Role::kPrefill, {}, 0, 2));
  ASSERT_TRUE(s.ok()) << s.status().str();
  EXPECT_EQ(s->instance, 2u);
  std::string neg = encode_ready(Role::kDecode, 2);
  neg.insert(neg.size() - 1, R"(,"instance":-1)");
  EXPECT_EQ(decode_router_frame(neg).status().code(), ErrorCode::kProtocolError) << neg;
}

}  // namespace
}  // namespace kvferry
