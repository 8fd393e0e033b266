// The bootstrap service's Authorization header (src/core/request_mac.cc), read before the MAC is
// checked: parse_mac_header, then a RequestVerifier with a fixed key at the header's own ts.
// An accepted header is canonical (re-formatting its fields gives the input); the verifier accepts
// it exactly when its MAC is the request's, and never twice.
#include <cstddef>
#include <cstdint>
#include <string>

#include <sodium.h>

#include "core/request_mac.h"
#include "fuzz_util.h"

namespace {

const kvferry::security::ClusterKeys& keys() {
  static const kvferry::security::ClusterKeys k = *kvferry::security::derive_keys("request mac fuzz secret 0123456789");
  return k;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvferry::security;
  const std::string header(reinterpret_cast<const char*>(data), size);
  auto h = parse_mac_header(header);
  if (!h.ok()) {
    RequestVerifier v(keys());
    FUZZ_CHECK(v.verify(header, "GET", "/health", "", 1'800'000'000) != MacVerdict::kOk);
    return 0;
  }
  char mac_hex[65];
  sodium_bin2hex(mac_hex, sizeof mac_hex, h->mac.data(), h->mac.size());
  FUZZ_CHECK("KVF-MAC v=1,ts=" + h->ts_text + ",nonce=" + h->nonce_text + ",mac=" + mac_hex == header);
  FUZZ_CHECK(std::to_string(h->ts) == h->ts_text);
  RequestVerifier v(keys());
  const bool right = request_mac(keys(), "GET", "/health", h->ts_text, h->nonce_text, "") == h->mac;
  FUZZ_CHECK(v.precheck(header, h->ts) == MacVerdict::kOk);
  const MacVerdict first = v.verify(header, "GET", "/health", "", h->ts);
  FUZZ_CHECK((first == MacVerdict::kOk) == right);
  FUZZ_CHECK(v.verify(header, "GET", "/health", "", h->ts) != MacVerdict::kOk);
  return 0;
}
