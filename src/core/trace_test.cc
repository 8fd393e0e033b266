#include "kvferry/trace.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

const std::string kData = std::string(KVFERRY_SOURCE_DIR) + "/data/traces/";

TEST(Trace, MooncakeConversationLoads) {
  TraceFormat fmt{};
  auto t = load_trace(kData + "conversation_trace.jsonl", 0, &fmt);
  ASSERT_TRUE(t.ok()) << t.status().str();
  EXPECT_EQ(fmt, TraceFormat::kMooncakeJsonl);
  ASSERT_EQ(t->size(), 12031u);
  EXPECT_EQ((*t)[0].arrival_ms, 0u);
  EXPECT_EQ((*t)[0].input_tokens, 6758u);
  EXPECT_EQ((*t)[0].output_tokens, 500u);
  EXPECT_EQ((*t)[0].line, 1u);
  EXPECT_EQ((*t)[1].input_tokens, 7322u);
  EXPECT_EQ((*t)[1].output_tokens, 490u);
  EXPECT_EQ(t->back().arrival_ms, 3536999u);
  EXPECT_EQ(t->back().input_tokens, 20774u);
  EXPECT_EQ(t->back().output_tokens, 508u);
  EXPECT_EQ(t->back().line, 12031u);
}

TEST(Trace, AzureCodeLoads) {
  TraceFormat fmt{};
  auto t = load_trace(kData + "AzureLLMInferenceTrace_code.csv", 0, &fmt);
  ASSERT_TRUE(t.ok()) << t.status().str();
  EXPECT_EQ(fmt, TraceFormat::kAzureCsv);
  ASSERT_EQ(t->size(), 8819u);
  EXPECT_EQ((*t)[0].arrival_ms, 0u);
  EXPECT_EQ((*t)[0].input_tokens, 4808u);
  EXPECT_EQ((*t)[0].output_tokens, 10u);
  EXPECT_EQ((*t)[0].line, 2u);
  EXPECT_EQ((*t)[1].arrival_ms, 52u);  // 18:17:04.0319600 - 18:17:03.9799600
  EXPECT_EQ((*t)[1].input_tokens, 3180u);
  EXPECT_EQ((*t)[2].arrival_ms, 98u);  // .0781490 - .9799600 of the previous second
  EXPECT_EQ((*t)[2].input_tokens, 110u);
  EXPECT_EQ(t->back().arrival_ms, 3435948u);  // 19:14:19.9280160, the last row (no newline)
  EXPECT_EQ(t->back().input_tokens, 549u);
  EXPECT_EQ(t->back().output_tokens, 173u);
}

TEST(Trace, MaxRequests) {
  auto t = load_trace(kData + "conversation_trace.jsonl", 5, nullptr);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->size(), 5u);
  auto a = load_trace(kData + "AzureLLMInferenceTrace_code.csv", 3, nullptr);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->size(), 3u);
  EXPECT_EQ((*a)[2].input_tokens, 110u);
}

TEST(Trace, MooncakeArrivalsAreRelativeAndBlankTrailingLineIsOk) {
  auto t = parse_trace(
      "{\"timestamp\": 100, \"input_length\": 5, \"output_length\": 0}\n"
      "{\"timestamp\": 100, \"input_length\": 6, \"output_length\": 2, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 250, \"input_length\": 7, \"output_length\": 3}\n\n",
      0);
  ASSERT_TRUE(t.ok()) << t.status().str();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[0].arrival_ms, 0u);
  EXPECT_EQ((*t)[1].arrival_ms, 0u);
  EXPECT_EQ((*t)[2].arrival_ms, 150u);
  EXPECT_EQ((*t)[2].output_tokens, 3u);
}

Status parse_error(const std::string& text) {
  auto t = parse_trace(text, 0);
  EXPECT_FALSE(t.ok());
  if (t.ok()) return Status();
  EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument);
  return t.status();
}

bool contains(const Status& s, const std::string& what) { return s.message().find(what) != std::string::npos; }

TEST(Trace, MooncakeErrorsNameTheLine) {
  const std::string ok1 = "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n";
  const std::string ok2 = "{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1}\n";
  Status s = parse_error(ok1 + ok2 + "{\"timestamp\": 2, \"input_length\": 5,\n");
  EXPECT_TRUE(contains(s, "line 3: malformed JSON")) << s.str();
  s = parse_error(ok1 + "{\"timestamp\": 2, \"output_length\": 1}\n");
  EXPECT_TRUE(contains(s, "line 2: missing field 'input_length'")) << s.str();
  s = parse_error(ok1 + "{\"timestamp\": 2, \"input_length\": 1.5, \"output_length\": 1}\n");
  EXPECT_TRUE(contains(s, "line 2: 'input_length' must be an integer")) << s.str();
  s = parse_error(ok1 + "{\"timestamp\": \"3\", \"input_length\": 1, \"output_length\": 1}\n");
  EXPECT_TRUE(contains(s, "line 2: 'timestamp' must be an integer")) << s.str();
  s = parse_error(ok1 + ok2 + ok2 + "{\"timestamp\": 2, \"input_length\": 0, \"output_length\": 1}\n");
  EXPECT_TRUE(contains(s, "line 4: input_length must be > 0")) << s.str();
  s = parse_error(ok1 + "{\"timestamp\": 2, \"input_length\": 3, \"output_length\": -1}\n");
  EXPECT_TRUE(contains(s, "line 2: 'output_length' must not be negative")) << s.str();
  s = parse_error(ok2 + ok1);
  EXPECT_TRUE(contains(s, "line 2: timestamp 0 is before")) << s.str();
  s = parse_error(ok1 + "[1, 2]\n");
  EXPECT_TRUE(contains(s, "line 2: expected a JSON object")) << s.str();
}

TEST(Trace, AzureLfAndCrlfAgree) {
  const std::string lf =
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-12-31 23:59:59.9990000,100,5\n"
      "2024-01-01 00:00:01.0000000,200,0\n"
      "2024-03-01 00:00:00.5,300,7\n";
  std::string crlf;
  for (char c : lf) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  crlf.pop_back();  // no trailing newline, like the real file
  crlf.pop_back();
  for (const std::string& text : {lf, crlf}) {
    TraceFormat fmt{};
    auto t = parse_trace(text, 0, &fmt);
    ASSERT_TRUE(t.ok()) << t.status().str();
    EXPECT_EQ(fmt, TraceFormat::kAzureCsv);
    ASSERT_EQ(t->size(), 3u);
    EXPECT_EQ((*t)[0].arrival_ms, 0u);
    EXPECT_EQ((*t)[1].arrival_ms, 1001u);  // across a year boundary
    // 2024 is a leap year: Jan 31 + Feb 29 days after Jan 1, plus 0.501 s.
    EXPECT_EQ((*t)[2].arrival_ms, (31ull + 29ull) * 86400000ull + 501ull);
    EXPECT_EQ((*t)[1].output_tokens, 0u);
    EXPECT_EQ((*t)[2].input_tokens, 300u);
    EXPECT_EQ((*t)[2].line, 4u);
  }
}

TEST(Trace, AzureErrorsNameTheLine) {
  const std::string head = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n";
  const std::string row = "2023-11-16 18:17:03.9799600,4808,10\r\n";
  Status s = parse_error(head + row + "2023-11-16 18:17:0x.9799600,4808,10\r\n");
  EXPECT_TRUE(contains(s, "line 3: bad timestamp")) << s.str();
  s = parse_error(head + row + "2023-02-29 18:17:04.0,4808,10\r\n");  // 2023 is not a leap year
  EXPECT_TRUE(contains(s, "line 3: bad timestamp")) << s.str();
  s = parse_error(head + row + "2023-11-16 24:00:00.0,4808,10\r\n");
  EXPECT_TRUE(contains(s, "line 3: bad timestamp")) << s.str();
  s = parse_error(head + "2023-11-16 18:17:04.0,4808\r\n");
  EXPECT_TRUE(contains(s, "line 2: expected 3 columns, got 2")) << s.str();
  s = parse_error(head + "2023-11-16 18:17:04.0,1,2,3\r\n");
  EXPECT_TRUE(contains(s, "line 2: expected 3 columns, got 4")) << s.str();
  s = parse_error(head + row + row + "2023-11-16 18:17:04.0,abc,2\r\n");
  EXPECT_TRUE(contains(s, "line 4: ContextTokens must be a non-negative integer")) << s.str();
  s = parse_error(head + "2023-11-16 18:17:04.0,0,2\r\n");
  EXPECT_TRUE(contains(s, "line 2: ContextTokens must be > 0")) << s.str();
  s = parse_error(head + "2023-11-16 18:17:04.0,5,-2\r\n");
  EXPECT_TRUE(contains(s, "line 2: GeneratedTokens")) << s.str();
  s = parse_error(head + row + "2023-11-16 18:17:03.0,5,2\r\n");
  EXPECT_TRUE(contains(s, "line 3: timestamp is before")) << s.str();
}

// Found by fuzz/trace_fuzz.cc: a year whose ns since the epoch do not fit int64 overflowed
// (undefined behaviour) instead of being refused.
TEST(Trace, AzureTimestampOutsideTheNsRangeIsRefused) {
  const std::string head = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  for (const char* ts : {"1011-11-16 18:17:03.9799600", "1677-09-21 00:12:43", "2262-04-11 23:47:17",
                         "9999-12-31 23:59:59.999999999", "0000-01-01 00:00:00"}) {
    Status s = parse_error(head + ts + ",4808,10\n");
    EXPECT_TRUE(contains(s, "line 2: bad timestamp")) << ts << ": " << s.str();
  }
}

// Arrivals relative to the first row stay exact when the two times are further apart than
// INT64_MAX ns (the difference overflowed int64 before fuzz/trace_fuzz.cc found it).
TEST(Trace, AzureArrivalsSpanningCenturiesDoNotOverflow) {
  auto t = parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                       "1700-01-01 00:00:00,1,1\n"
                       "2200-01-01 00:00:00.5,1,1\n"
                       "2262-04-11 23:47:15.999999999,1,1\n",
                       0);
  ASSERT_TRUE(t.ok()) << t.status().str();
  ASSERT_EQ(t->size(), 3u);
  // 500 years with 121 leap days (1700, 1800, 1900, 2100 are not leap years), plus 0.5 s.
  EXPECT_EQ((*t)[1].arrival_ms, 182621ull * 86400000ull + 500ull);
  EXPECT_GT((*t)[2].arrival_ms, (*t)[1].arrival_ms);
}

TEST(Trace, UnknownFormatAndEmpty) {
  Status s = parse_error("time,in,out\n1,2,3\n");
  EXPECT_TRUE(contains(s, "unknown trace format")) << s.str();
  EXPECT_TRUE(contains(s, "Mooncake JSONL")) << s.str();
  EXPECT_TRUE(contains(s, "TIMESTAMP,ContextTokens,GeneratedTokens")) << s.str();
  s = parse_error("");
  EXPECT_TRUE(contains(s, "unknown trace format")) << s.str();
  s = parse_error("TIMESTAMP,ContextTokens,GeneratedTokens\r\n");
  EXPECT_TRUE(contains(s, "no requests")) << s.str();
}

TEST(Trace, MissingFileNamesThePath) {
  auto t = load_trace("/nonexistent/dir/trace.jsonl", 0);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(t.status(), "/nonexistent/dir/trace.jsonl")) << t.status().str();
}

}  // namespace
}  // namespace kvferry
