// The trace parser (src/core/trace.cc): Mooncake JSONL or Azure CSV, detected from the text;
// parse_trace() of any text never crashes or throws, and what it accepts has prompts of > 0 tokens.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "kvferry/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  kvferry::TraceFormat format;
  auto r = kvferry::parse_trace(text, 0, &format);
  if (r.ok()) {
    for (const auto& q : *r) FUZZ_CHECK(q.input_tokens > 0);
  }
  (void)kvferry::parse_trace(text, 3);
  return 0;
}
