// Bootstrap request MACs and their verifier (request_mac.h).
#include "core/request_mac.h"

#include <sodium.h>
#include <time.h>

#include <charconv>

namespace kvferry::security {
namespace {

constexpr std::string_view kDomain = "kvferry bootstrap request";
constexpr std::string_view kVersion = "1";
constexpr size_t kMaxTsDigits = 19;  // fits int64_t
static_assert(crypto_generichash_BYTES == 32 && crypto_generichash_KEYBYTES == 32);

void absorb(crypto_generichash_state& st, std::string_view field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  const uint8_t len[4] = {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n >> 16),
                          static_cast<uint8_t>(n >> 24)};
  crypto_generichash_update(&st, len, sizeof len);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(field.data()), field.size());
}

template <size_t N>
std::string hex(const std::array<uint8_t, N>& b) {
  char out[2 * N + 1];
  sodium_bin2hex(out, sizeof out, b.data(), b.size());
  return std::string(out, 2 * N);
}

// Exactly 2*N lowercase hex digits into `out`.
template <size_t N>
bool unhex(std::string_view s, std::array<uint8_t, N>* out) {
  if (s.size() != 2 * N) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  size_t got = 0;
  return sodium_hex2bin(out->data(), N, s.data(), s.size(), nullptr, &got, nullptr) == 0 && got == N;
}

// "name=value" as the whole of `part`.
bool field(std::string_view part, std::string_view name, std::string_view* value) {
  if (part.size() < name.size() + 1 || part.substr(0, name.size()) != name || part[name.size()] != '=') return false;
  *value = part.substr(name.size() + 1);
  return true;
}

Status malformed(const std::string& what) {
  return Status(ErrorCode::kInvalidArgument, "Authorization KVF-MAC: " + what);
}

}  // namespace

Result<MacHeader> parse_mac_header(std::string_view a) {
  if (a.empty()) return malformed("missing");
  if (a.size() < kMacScheme.size() + 1 || a.substr(0, kMacScheme.size()) != kMacScheme || a[kMacScheme.size()] != ' ')
    return malformed("scheme: expected 'KVF-MAC '");
  // Exactly four comma-separated fields, in this order.
  constexpr std::string_view kNames[4] = {"v", "ts", "nonce", "mac"};
  std::string_view values[4];
  std::string_view rest = a.substr(kMacScheme.size() + 1);
  for (size_t i = 0; i < 4; ++i) {
    const size_t comma = rest.find(',');
    if (!field(rest.substr(0, comma), kNames[i], &values[i]))
      return malformed("field '" + std::string(kNames[i]) + "': missing");
    const bool last = i == 3;
    if ((comma == std::string_view::npos) != last)
      return malformed(last ? std::string("after field 'mac': unexpected text")
                            : "field '" + std::string(kNames[i + 1]) + "': missing");
    if (!last) rest.remove_prefix(comma + 1);
  }
  const std::string_view v = values[0], ts = values[1], nonce = values[2], mac = values[3];
  if (v != kVersion) return malformed("field 'v': version " + std::string(v.substr(0, 8)) + " is not 1");
  MacHeader h;
  if (ts.empty() || ts.size() > kMaxTsDigits || ts.find_first_not_of("0123456789") != std::string_view::npos ||
      (ts.size() > 1 && ts[0] == '0'))
    return malformed("field 'ts': expected unix seconds in decimal");
  auto [end, ec] = std::from_chars(ts.data(), ts.data() + ts.size(), h.ts);
  if (ec != std::errc() || end != ts.data() + ts.size()) return malformed("field 'ts': out of range");
  if (!unhex(nonce, &h.nonce)) return malformed("field 'nonce': expected 32 lowercase hex digits");
  if (!unhex(mac, &h.mac)) return malformed("field 'mac': expected 64 lowercase hex digits");
  h.ts_text = std::string(ts);
  h.nonce_text = std::string(nonce);
  return h;
}

Mac request_mac(const ClusterKeys& keys, std::string_view method, std::string_view target, std::string_view ts_text,
                std::string_view nonce_text, std::string_view body) {
  std::array<uint8_t, 32> body_hash{};
  crypto_generichash(body_hash.data(), body_hash.size(), reinterpret_cast<const uint8_t*>(body.data()), body.size(),
                     nullptr, 0);
  crypto_generichash_state st;
  crypto_generichash_init(&st, keys.bootstrap_mac_key.data(), keys.bootstrap_mac_key.size(), crypto_generichash_BYTES);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(kDomain.data()), kDomain.size());
  absorb(st, kVersion);
  absorb(st, method);
  absorb(st, target);
  absorb(st, ts_text);
  absorb(st, nonce_text);
  absorb(st, std::string_view(reinterpret_cast<const char*>(body_hash.data()), body_hash.size()));
  Mac out{};
  crypto_generichash_final(&st, out.data(), out.size());
  sodium_memzero(&st, sizeof st);
  return out;
}

std::string mac_authorization(const ClusterKeys& keys, std::string_view method, std::string_view target,
                              std::string_view body, int64_t unix_s, const Nonce& nonce) {
  const std::string ts = std::to_string(unix_s);
  const std::string n = hex(nonce);
  return std::string(kMacScheme) + " v=" + std::string(kVersion) + ",ts=" + ts + ",nonce=" + n +
         ",mac=" + hex(request_mac(keys, method, target, ts, n, body));
}

std::string mac_authorization(const ClusterKeys& keys, std::string_view method, std::string_view target,
                              std::string_view body) {
  Nonce nonce;
  randombytes_buf(nonce.data(), nonce.size());
  return mac_authorization(keys, method, target, body, unix_now_s(), nonce);
}

int64_t unix_now_s() {
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<int64_t>(t.tv_sec);
}

const char* verdict_text(MacVerdict v) {
  switch (v) {
    case MacVerdict::kOk: return "ok";
    case MacVerdict::kMissing: return "no KVF-MAC Authorization header";
    case MacVerdict::kMalformed: return "malformed KVF-MAC Authorization header";
    case MacVerdict::kStale:
      return "timestamp outside the service's window (the clocks of the cluster must agree to within 120 s)";
    case MacVerdict::kBadMac: return "the MAC is not this cluster's for this request";
    case MacVerdict::kReplayed: return "nonce already used";
  }
  return "refused";
}

RequestVerifier::RequestVerifier(const ClusterKeys& keys, size_t max_nonces, int64_t window_s)
    : keys_(keys), max_nonces_(max_nonces > 0 ? max_nonces : 1), window_s_(window_s) {}

MacVerdict RequestVerifier::fresh(const MacHeader& h, int64_t now_s) const {
  // ts and now_s are not negative (ts parses without a sign): neither difference overflows.
  if (h.ts < now_s - window_s_ || h.ts - now_s > window_s_) return MacVerdict::kStale;
  if (has_floor_ && Seen{h.ts, h.nonce} <= floor_) return MacVerdict::kStale;
  return MacVerdict::kOk;
}

void RequestVerifier::expire(int64_t now_s) {
  while (!seen_.empty() && seen_.begin()->first < now_s - window_s_) seen_.erase(seen_.begin());
}

MacVerdict RequestVerifier::precheck(std::string_view authorization, int64_t now_s) const {
  if (authorization.empty()) return MacVerdict::kMissing;
  auto h = parse_mac_header(authorization);
  if (!h.ok()) return MacVerdict::kMalformed;
  std::lock_guard lock(mu_);
  return fresh(*h, now_s);
}

MacVerdict RequestVerifier::verify(std::string_view authorization, std::string_view method, std::string_view target,
                                   std::string_view body, int64_t now_s) {
  auto refuse = [this](MacVerdict v) {
    std::lock_guard lock(mu_);
    ++refused_;
    return v;
  };
  if (authorization.empty()) return refuse(MacVerdict::kMissing);
  auto h = parse_mac_header(authorization);
  if (!h.ok()) return refuse(MacVerdict::kMalformed);
  const Mac want = request_mac(keys_, method, target, h->ts_text, h->nonce_text, body);
  if (sodium_memcmp(want.data(), h->mac.data(), want.size()) != 0) return refuse(MacVerdict::kBadMac);
  std::lock_guard lock(mu_);
  if (const MacVerdict v = fresh(*h, now_s); v != MacVerdict::kOk) {
    ++refused_;
    return v;
  }
  const Seen key{h->ts, h->nonce};
  if (seen_.count(key)) {
    ++refused_;
    return MacVerdict::kReplayed;
  }
  expire(now_s);
  seen_.insert(key);
  while (seen_.size() > max_nonces_) {  // the oldest ts goes, and becomes the floor
    floor_ = *seen_.begin();
    has_floor_ = true;
    seen_.erase(seen_.begin());
  }
  return MacVerdict::kOk;
}

size_t RequestVerifier::remembered() const {
  std::lock_guard lock(mu_);
  return seen_.size();
}

uint64_t RequestVerifier::refused() const {
  std::lock_guard lock(mu_);
  return refused_;
}

}  // namespace kvferry::security
