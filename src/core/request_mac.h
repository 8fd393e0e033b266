// Request MACs for the bootstrap service (docs/security.md, "The bootstrap service's MAC").
//
// A decode rank sends its bootstrap requests to whatever address a request names, so what it sends
// must be worth nothing anywhere else: instead of a bearer token, each request carries a MAC of
// itself under the cluster's bootstrap MAC key (ClusterKeys::bootstrap_mac_key, core/secret.h):
//
//   Authorization: KVF-MAC v=1,ts=<unix seconds>,nonce=<32 lowercase hex>,mac=<64 lowercase hex>
//
// mac = keyed BLAKE2b-256 (crypto_generichash, the MAC key) of the encoding
//   "kvferry bootstrap request" then, each as a 4-byte little-endian length and its bytes:
//   the scheme version "1", the method ("GET"), the request target as on the request line (path and
//   query string: "/route?engine_id=0&dp_rank=0"), ts in decimal as sent, the nonce's 32 hex digits
//   as sent, and BLAKE2b-256 (unkeyed) of the body (the empty body's for none).
// The header is parsed strictly: exactly these four fields in this order, one space after the
// scheme, no other whitespace, ts 1 to 19 decimal digits without sign or leading zero, hex in lower
// case.
//
// A server (RequestVerifier) accepts a request when its MAC is the one of that method, target,
// body, ts and nonce (compared in constant time), its ts is within kMacWindowS of the server's
// clock (realtime: the cluster's clocks must agree to well under that, e.g. NTP), and its (ts,
// nonce) was not accepted before. The replay cache keeps each accepted (ts, nonce) until its ts
// leaves the window, at most max_nonces of them: when full, the entry with the oldest ts goes and
// every request with a ts at or below it is refused as stale from then on (its floor), so a request
// is never accepted twice and the cache never grows; a flood of valid requests (only a holder of
// the key, or of that many captured requests, can make one) only narrows the window of clock skew
// accepted (docs/security.md).
// Thread contract: the free functions are pure; RequestVerifier is thread-safe.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "core/secret.h"
#include "kvferry/error.h"

namespace kvferry::security {

inline constexpr std::string_view kMacScheme = "KVF-MAC";
inline constexpr int64_t kMacWindowS = 120;
// 2^17 (ts, nonce) entries, about 9 MB: with requests living ~kMacWindowS each, ~1000 requests/s
// before the floor rises above now - kMacWindowS.
inline constexpr size_t kMaxSeenNonces = size_t{1} << 17;

using Nonce = std::array<uint8_t, 16>;
using Mac = std::array<uint8_t, 32>;

struct MacHeader {
  int64_t ts = 0;
  Nonce nonce{};
  Mac mac{};
  std::string ts_text;     // as sent (what the MAC covers)
  std::string nonce_text;  // as sent
};

// The header's fields; kInvalidArgument naming the first field that is missing or malformed.
Result<MacHeader> parse_mac_header(std::string_view authorization);

// The MAC of one request (the encoding above).
Mac request_mac(const ClusterKeys& keys, std::string_view method, std::string_view target, std::string_view ts_text,
                std::string_view nonce_text, std::string_view body);

// The Authorization header value for a request, at `unix_s` with `nonce` (tests), or now with a
// fresh random nonce (libsodium's CSPRNG).
std::string mac_authorization(const ClusterKeys& keys, std::string_view method, std::string_view target,
                              std::string_view body, int64_t unix_s, const Nonce& nonce);
std::string mac_authorization(const ClusterKeys& keys, std::string_view method, std::string_view target,
                              std::string_view body);

int64_t unix_now_s();  // CLOCK_REALTIME, seconds

enum class MacVerdict { kOk, kMissing, kMalformed, kStale, kBadMac, kReplayed };
const char* verdict_text(MacVerdict v);  // a phrase for the 401's body ("timestamp outside ...")

class RequestVerifier {
 public:
  explicit RequestVerifier(const ClusterKeys& keys, size_t max_nonces = kMaxSeenNonces,
                           int64_t window_s = kMacWindowS);

  // What can be told without the body: the header parses and its ts is within the window (and above
  // the floor). Changes nothing. kOk means only "read the body and verify()".
  MacVerdict precheck(std::string_view authorization, int64_t now_s) const;
  // The whole check; on kOk the (ts, nonce) is remembered (a refused request changes nothing).
  MacVerdict verify(std::string_view authorization, std::string_view method, std::string_view target,
                    std::string_view body, int64_t now_s);

  size_t remembered() const;
  uint64_t refused() const;  // every verdict but kOk, from verify()

 private:
  using Seen = std::pair<int64_t, Nonce>;  // (ts, nonce): a replay has both (the MAC covers them)
  MacVerdict fresh(const MacHeader& h, int64_t now_s) const;  // mu_ held
  void expire(int64_t now_s);                                  // mu_ held

  const ClusterKeys& keys_;
  const size_t max_nonces_;
  const int64_t window_s_;
  mutable std::mutex mu_;
  std::set<Seen> seen_;    // guarded by mu_
  bool has_floor_ = false;  // guarded by mu_: entries at or below floor_ were dropped for room
  Seen floor_{};            // guarded by mu_
  uint64_t refused_ = 0;    // guarded by mu_
};

}  // namespace kvferry::security
