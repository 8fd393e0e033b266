// Request traces: Mooncake JSONL and Azure LLM inference CSV, detected from content.
//
// Mooncake (FAST'25 release): one JSON object per line with `timestamp` (ms from trace start),
//   `input_length`, `output_length` (tokens) and `hash_ids` (one per 512-token block).
// Azure 2023 (Splitwise): CSV header `TIMESTAMP,ContextTokens,GeneratedTokens`, TIMESTAMP as
//   "YYYY-MM-DD HH:MM:SS.fffffff" (no zone), CRLF line ends; arrival = offset from the first row.
// Errors name the file's line number (1-based) and the problem: kInvalidArgument.
// Thread contract: pure functions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvferry/error.h"

namespace kvferry {

struct TraceRequest {
  uint64_t arrival_ms = 0;     // from the trace's first request
  uint64_t input_tokens = 0;   // prompt tokens (prefill size), > 0
  uint64_t output_tokens = 0;
  uint64_t line = 0;           // 1-based line in the file
};

enum class TraceFormat { kMooncakeJsonl, kAzureCsv };

// Parses at most `max_requests` requests (0: all).
Result<std::vector<TraceRequest>> parse_trace(const std::string& text, size_t max_requests,
                                              TraceFormat* detected = nullptr);
Result<std::vector<TraceRequest>> load_trace(const std::string& path, size_t max_requests,
                                             TraceFormat* detected = nullptr);

}  // namespace kvferry
