// Error vocabulary: code names, RankId text form, Status printing, clocks.
#include "kvferry/error.h"

#include <array>
#include <charconv>
#include <ctime>

namespace kvferry {
namespace {

constexpr std::array<std::string_view, kMaxErrorCode + 1> kCodeNames = {
    "ok",      "transfer_error", "peer_unreachable", "bootstrap_timeout",
    "waiting_timeout", "prealloc_timeout", "aborted", "protocol_error",
    "resource_exhausted", "injected", "invalid_argument", "internal",
    "incompatible_peer",
    "integrity_error",
};

// Parses a non-empty run of decimal digits (no sign, no leading '+') that fits uint32_t.
std::optional<uint32_t> parse_u32(std::string_view s) {
  if (s.empty()) return std::nullopt;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  // Canonical form only ("01" is rejected) so parse() is the exact inverse of str().
  if (s.size() > 1 && s[0] == '0') return std::nullopt;
  uint32_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

std::string_view code_name(ErrorCode c) {
  const auto i = static_cast<size_t>(c);
  if (i < kCodeNames.size() && !kCodeNames[i].empty()) return kCodeNames[i];
  return "unknown";
}

std::optional<ErrorCode> code_from_name(std::string_view s) {
  if (s.empty()) return std::nullopt;
  for (size_t i = 0; i < kCodeNames.size(); ++i) {
    if (kCodeNames[i] == s) return static_cast<ErrorCode>(i);
  }
  return std::nullopt;
}

std::optional<ErrorCode> code_from_int(int v) {
  if (v < 0 || v > kMaxErrorCode || kCodeNames[static_cast<size_t>(v)].empty()) return std::nullopt;
  return static_cast<ErrorCode>(v);
}

std::string_view role_name(Role r) { return r == Role::kPrefill ? "prefill" : "decode"; }

std::string RankId::str() const {
  std::string s(role_name(role));
  if (engine_id != 0) s += std::to_string(engine_id);
  s += "/tp";
  s += std::to_string(tp_rank);
  if (dp_rank != 0) {
    s += "/dp";
    s += std::to_string(dp_rank);
  }
  return s;
}

std::optional<RankId> RankId::parse(std::string_view s) {
  RankId id;
  std::string_view rest;
  if (s.starts_with("prefill")) {
    id.role = Role::kPrefill;
    rest = s.substr(7);
  } else if (s.starts_with("decode")) {
    id.role = Role::kDecode;
    rest = s.substr(6);
  } else {
    return std::nullopt;
  }
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const std::string_view engine = rest.substr(0, slash);
  if (!engine.empty()) {
    auto e = parse_u32(engine);
    if (!e || *e == 0) return std::nullopt;  // "prefill0/tp0" is not canonical
    id.engine_id = *e;
  }
  rest = rest.substr(slash + 1);
  if (!rest.starts_with("tp")) return std::nullopt;
  rest = rest.substr(2);
  const size_t slash2 = rest.find('/');
  auto tp = parse_u32(rest.substr(0, slash2));
  if (!tp) return std::nullopt;
  id.tp_rank = *tp;
  if (slash2 != std::string_view::npos) {
    std::string_view dp = rest.substr(slash2 + 1);
    if (!dp.starts_with("dp")) return std::nullopt;
    auto d = parse_u32(dp.substr(2));
    if (!d || *d == 0) return std::nullopt;  // "/dp0" is not canonical
    id.dp_rank = *d;
  }
  return id;
}

std::string Status::str() const {
  if (ok()) return "ok";
  std::string s(code_name(code_));
  s += ": ";
  s += message_;
  return s;
}

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

int64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

int64_t wall_from_monotonic(int64_t mono_ns) {
  const int64_t wall = realtime_ns();
  return wall - (monotonic_ns() - mono_ns);
}

}  // namespace kvferry
