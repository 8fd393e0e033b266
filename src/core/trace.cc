// Trace parsing: Mooncake JSONL and Azure LLM inference CSV, detected from content (see trace.h).
#include "kvferry/trace.h"

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

namespace kvferry {
namespace {

constexpr std::string_view kAzureHeader = "TIMESTAMP,ContextTokens,GeneratedTokens";

Status line_error(uint64_t line, const std::string& what) {
  return {ErrorCode::kInvalidArgument, "line " + std::to_string(line) + ": " + what};
}

// Splits `text` into lines (LF or CRLF), calling fn(line_without_eol, 1-based number) until fn
// returns false.
template <typename Fn>
void for_each_line(std::string_view text, Fn&& fn) {
  uint64_t number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    const size_t next = end == std::string_view::npos ? text.size() : end + 1;
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!fn(line, ++number)) return;
    pos = next;
  }
}

bool is_blank(std::string_view s) {
  return s.find_first_not_of(" \t\r") == std::string_view::npos;
}

// A whole string of decimal digits that fits uint64_t.
std::optional<uint64_t> parse_uint(std::string_view s) {
  if (s.empty()) return std::nullopt;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s[0] == '-' || s[0] == '+') return std::nullopt;
  return v;
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil algorithm).
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

bool leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

// Fixed-width digits at s[pos, pos+n).
std::optional<unsigned> digits(std::string_view s, size_t pos, size_t n) {
  if (pos + n > s.size()) return std::nullopt;
  unsigned v = 0;
  for (size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    v = v * 10 + unsigned(s[i] - '0');
  }
  return v;
}

// "YYYY-MM-DD HH:MM:SS[.f{1,9}]" (no zone) -> ns since the Unix epoch.
std::optional<int64_t> parse_azure_time(std::string_view s) {
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':') {
    return std::nullopt;
  }
  auto y = digits(s, 0, 4), mo = digits(s, 5, 2), d = digits(s, 8, 2);
  auto h = digits(s, 11, 2), mi = digits(s, 14, 2), sec = digits(s, 17, 2);
  if (!y || !mo || !d || !h || !mi || !sec) return std::nullopt;
  static constexpr unsigned kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (*mo < 1 || *mo > 12 || *d < 1) return std::nullopt;
  const unsigned mdays = kDays[*mo - 1] + (*mo == 2 && leap(*y) ? 1 : 0);
  if (*d > mdays || *h > 23 || *mi > 59 || *sec > 59) return std::nullopt;
  int64_t frac_ns = 0;
  if (s.size() > 19) {
    if (s[19] != '.' || s.size() == 20 || s.size() > 29) return std::nullopt;
    auto f = digits(s, 20, s.size() - 20);
    if (!f) return std::nullopt;
    frac_ns = *f;
    for (size_t n = s.size() - 20; n < 9; ++n) frac_ns *= 10;
  }
  const int64_t days = days_from_civil(*y, *mo, *d);  // 4-digit years: no overflow here
  const int64_t secs = days * 86400 + int64_t(*h) * 3600 + int64_t(*mi) * 60 + *sec;
  // Int64 ns since the epoch reach 1677-09-21 .. 2262-04-11; a time outside is refused, not
  // overflowed (found by fuzz/trace_fuzz.cc).
  constexpr int64_t kMaxSecs = (INT64_MAX - 999999999) / 1000000000LL;
  constexpr int64_t kMinSecs = INT64_MIN / 1000000000LL;
  if (secs > kMaxSecs || secs < kMinSecs) return std::nullopt;
  return secs * 1000000000LL + frac_ns;
}

// Non-negative integer JSON field.
Status json_uint(const nlohmann::json& obj, const char* key, uint64_t line, uint64_t* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return line_error(line, std::string("missing field '") + key + "'");
  if (it->is_number_unsigned()) {
    *out = it->get<uint64_t>();
    return {};
  }
  if (it->is_number_integer()) return line_error(line, std::string("'") + key + "' must not be negative");
  return line_error(line, std::string("'") + key + "' must be an integer");
}

Result<std::vector<TraceRequest>> parse_mooncake(std::string_view text, size_t max_requests) {
  std::vector<TraceRequest> out;
  Status err;
  uint64_t first_ts = 0, last_ts = 0;
  for_each_line(text, [&](std::string_view line, uint64_t number) {
    if (is_blank(line)) return true;
    auto obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (obj.is_discarded()) {
      err = line_error(number, "malformed JSON");
      return false;
    }
    if (!obj.is_object()) {
      err = line_error(number, "expected a JSON object");
      return false;
    }
    uint64_t ts = 0;
    TraceRequest r;
    r.line = number;
    for (auto [key, dst] : {std::pair{"timestamp", &ts}, std::pair{"input_length", &r.input_tokens},
                            std::pair{"output_length", &r.output_tokens}}) {
      err = json_uint(obj, key, number, dst);
      if (!err.ok()) return false;
    }
    if (r.input_tokens == 0) {
      err = line_error(number, "input_length must be > 0");
      return false;
    }
    if (out.empty()) {
      first_ts = ts;
    } else if (ts < last_ts) {
      err = line_error(number, "timestamp " + std::to_string(ts) + " is before the previous one (" +
                                   std::to_string(last_ts) + ")");
      return false;
    }
    last_ts = ts;
    r.arrival_ms = ts - first_ts;
    out.push_back(r);
    return max_requests == 0 || out.size() < max_requests;
  });
  if (!err.ok()) return err;
  return out;
}

Result<std::vector<TraceRequest>> parse_azure(std::string_view text, size_t max_requests) {
  std::vector<TraceRequest> out;
  Status err;
  bool header_seen = false;
  int64_t first_ns = 0, last_ns = 0;
  for_each_line(text, [&](std::string_view line, uint64_t number) {
    if (is_blank(line)) return true;
    if (!header_seen) {  // detection guarantees the first non-blank line is the header
      header_seen = true;
      return true;
    }
    std::string_view cols[3];
    size_t n = 0, pos = 0;
    while (true) {
      const size_t comma = line.find(',', pos);
      if (n < 3) cols[n] = line.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
      ++n;
      if (comma == std::string_view::npos) break;
      pos = comma + 1;
    }
    if (n != 3) {
      err = line_error(number, "expected 3 columns, got " + std::to_string(n));
      return false;
    }
    auto ns = parse_azure_time(cols[0]);
    if (!ns) {
      err = line_error(number, "bad timestamp '" + std::string(cols[0]) + "' (want YYYY-MM-DD HH:MM:SS.fffffff)");
      return false;
    }
    auto ctx = parse_uint(cols[1]);
    auto gen = parse_uint(cols[2]);
    if (!ctx || !gen) {
      err = line_error(number, std::string(!ctx ? "ContextTokens" : "GeneratedTokens") +
                                   " must be a non-negative integer");
      return false;
    }
    if (*ctx == 0) {
      err = line_error(number, "ContextTokens must be > 0");
      return false;
    }
    if (out.empty()) {
      first_ns = *ns;
    } else if (*ns < last_ns) {
      err = line_error(number, "timestamp is before the previous row's");
      return false;
    }
    last_ns = *ns;
    TraceRequest r;
    // *ns >= first_ns, but the difference of two int64 times may exceed INT64_MAX: unsigned.
    r.arrival_ms = (static_cast<uint64_t>(*ns) - static_cast<uint64_t>(first_ns)) / 1000000;
    r.input_tokens = *ctx;
    r.output_tokens = *gen;
    r.line = number;
    out.push_back(r);
    return max_requests == 0 || out.size() < max_requests;
  });
  if (!err.ok()) return err;
  return out;
}

}  // namespace

Result<std::vector<TraceRequest>> parse_trace(const std::string& text, size_t max_requests,
                                              TraceFormat* detected) {
  std::string_view body(text);
  if (body.starts_with("\xEF\xBB\xBF")) body.remove_prefix(3);  // UTF-8 byte order mark
  std::string_view first;
  for_each_line(body, [&](std::string_view line, uint64_t) {
    if (is_blank(line)) return true;
    first = line;
    return false;
  });
  Result<std::vector<TraceRequest>> result(ErrorCode::kInternal, "unset");
  TraceFormat format;
  if (first.starts_with("{")) {
    format = TraceFormat::kMooncakeJsonl;
    result = parse_mooncake(body, max_requests);
  } else if (first == kAzureHeader) {
    format = TraceFormat::kAzureCsv;
    result = parse_azure(body, max_requests);
  } else {
    return Status(ErrorCode::kInvalidArgument,
                  "unknown trace format: expected Mooncake JSONL (one {\"timestamp\", \"input_length\", "
                  "\"output_length\"} object per line) or Azure LLM inference CSV (header " +
                      std::string(kAzureHeader) + ")");
  }
  if (result.ok() && result->empty()) return Status(ErrorCode::kInvalidArgument, "trace has no requests");
  if (result.ok() && detected != nullptr) *detected = format;
  return result;
}

Result<std::vector<TraceRequest>> load_trace(const std::string& path, size_t max_requests,
                                             TraceFormat* detected) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(ErrorCode::kInvalidArgument,
                  "cannot open trace file '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Status(ErrorCode::kInvalidArgument, "cannot read trace file '" + path + "'");
  auto result = parse_trace(buf.str(), max_requests, detected);
  if (!result.ok()) return Status(result.status().code(), path + ": " + result.status().message());
  return result;
}

}  // namespace kvferry
