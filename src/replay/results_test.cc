#include "replay/results.h"

#include <gtest/gtest.h>

namespace kvferry::replay {
namespace {

TEST(Results, RoundTrip) {
  ReplayResults r;
  r.dispatch_start_ns = 10;
  r.dispatch_end_ns = 20;
  r.last_result_ns = 30;
  RequestOutcome a;
  a.room = 0x7123456789abcdefULL;
  a.input_tokens = 5000;
  a.output_tokens = 12;
  a.arrival_ms = 77;
  a.dispatched_ns = 15;
  a.fault = *fault_from_names("decode_fail", "decode/tp1");
  RoomResult d;
  d.role = Role::kDecode;
  d.room = a.room;
  d.state = KVPoll::Failed;
  d.code = ErrorCode::kInjected;
  d.origin = "decode/tp1";
  d.reason = "injected";
  d.ranks_failed = 2;
  a.decode = d;
  r.requests.push_back(a);
  RequestOutcome b;
  b.room = 3;
  b.input_tokens = 1;
  b.router_failure = "router: no result within 300 s";
  r.requests.push_back(b);
  r.prefill_stats = std::vector<RankLeakStats>{{"prefill/tp0", 1, 2, 3, 4}};
  r.requests[0].abort_sent_ns = 17;
  r.requests[0].error = final_error(r.requests[0]);

  auto back = decode_results(encode_results(r));
  ASSERT_TRUE(back.ok()) << back.status().str();
  EXPECT_EQ(back->dispatch_start_ns, 10);
  EXPECT_EQ(back->dispatch_end_ns, 20);
  EXPECT_EQ(back->last_result_ns, 30);
  ASSERT_EQ(back->requests.size(), 2u);
  const RequestOutcome& x = back->requests[0];
  EXPECT_EQ(x.room, a.room);
  EXPECT_EQ(x.input_tokens, 5000u);
  EXPECT_EQ(x.output_tokens, 12u);
  EXPECT_EQ(x.arrival_ms, 77u);
  EXPECT_EQ(x.dispatched_ns, 15);
  ASSERT_TRUE(x.fault.has_value());
  EXPECT_EQ(x.fault->at.str(), "decode/tp1");
  EXPECT_FALSE(x.prefill.has_value());
  ASSERT_TRUE(x.decode.has_value());
  EXPECT_EQ(x.decode->code, ErrorCode::kInjected);
  EXPECT_EQ(x.decode->origin, "decode/tp1");
  EXPECT_EQ(x.decode->ranks_failed, 2u);
  EXPECT_EQ(x.abort_sent_ns, 17);
  EXPECT_EQ(x.error, "room " + std::to_string(a.room) + " failed: injected at decode/tp1: injected");
  EXPECT_EQ(back->requests[1].error, "");
  EXPECT_EQ(back->requests[1].router_failure, "router: no result within 300 s");
  EXPECT_FALSE(back->requests[1].fault.has_value());
  ASSERT_TRUE(back->prefill_stats.has_value());
  EXPECT_EQ((*back->prefill_stats)[0].peers, 4u);
  EXPECT_FALSE(back->decode_stats.has_value());
}

TEST(Results, FinalErrorNamesRoomCodeOriginAndReason) {
  RequestOutcome q;
  q.room = 42;
  RoomResult p;
  p.role = Role::kPrefill;
  p.room = 42;
  p.state = KVPoll::Success;
  q.prefill = p;
  q.decode = p;
  q.decode->role = Role::kDecode;
  EXPECT_EQ(final_error(q), "");  // both succeeded
  q.prefill->state = KVPoll::Failed;
  q.prefill->code = ErrorCode::kTransferError;
  q.prefill->origin = "prefill/tp1";
  q.prefill->reason = "write failed";
  EXPECT_EQ(final_error(q), "room 42 failed: transfer_error at prefill/tp1: write failed");
  q.decode->state = KVPoll::Failed;
  q.decode->code = ErrorCode::kWaitingTimeout;
  q.decode->origin = "decode/tp0";
  q.decode->reason = "no data";
  EXPECT_EQ(final_error(q),
            "room 42 failed: waiting_timeout at decode/tp0: no data (prefill engine: transfer_error at prefill/tp1)");
  q.decode->code = ErrorCode::kTransferError;
  q.decode->origin = "prefill/tp1";
  EXPECT_EQ(final_error(q), "room 42 failed: transfer_error at prefill/tp1: no data");
  q.router_failure = "router: no result within 5 s";
  EXPECT_EQ(final_error(q), "room 42 failed: internal at router: router: no result within 5 s");
}

TEST(Results, RejectsMalformedFiles) {
  EXPECT_EQ(decode_results("").status().code(), ErrorCode::kProtocolError);
  EXPECT_EQ(decode_results("[]").status().code(), ErrorCode::kProtocolError);
  EXPECT_FALSE(decode_results(R"({"version":2})").ok());
  const std::string head =
      R"({"version":1,"dispatch_start_ns":0,"dispatch_end_ns":0,"last_result_ns":0,"stats":{},"requests":)";
  EXPECT_TRUE(decode_results(head + "[]}").ok());
  EXPECT_FALSE(decode_results(head + R"([{"room":"x"}]})").ok());
  auto bad_result = decode_results(
      head +
      R"([{"room":"1","input_tokens":1,"output_tokens":1,"arrival_ms":0,"dispatched_ns":0,"router_failure":"","fault":null,"prefill":{"role":"prefill"},"decode":null}]})");
  ASSERT_FALSE(bad_result.ok());
  EXPECT_NE(bad_result.status().message().find("prefill"), std::string::npos);
}

}  // namespace
}  // namespace kvferry::replay
