// The cluster's shared secret and the keys derived from it (docs/security.md).
//
// One secret per cluster, from the environment (read once per process):
//   KVFERRY_SECRET_FILE  path of a file holding the secret (surrounding whitespace ignored); the
//                        file must not be accessible to group or others (like ssh keys), else
//                        every use fails with kInvalidArgument naming the file and its mode.
//   KVFERRY_SECRET       the secret itself (weaker: environments leak into /proc/PID/environ of
//                        the same user, core dumps and crash reports). The file wins when both are
//                        set. Empty values are unset.
// A secret has at least kMinSecretBytes bytes. Without one, nothing is authenticated (today's
// behaviour); with one, every ZeroMQ socket uses CURVE with the cluster's keypair, the bootstrap
// service requires a MAC of each request (core/request_mac.h: "Authorization: KVF-MAC ...") and a
// rank's /metrics "Authorization: Bearer <token>".
//
// Derivation (libsodium): master = BLAKE2b-256(secret, key "kvferry cluster secret v1");
// curve seed = crypto_kdf(master, id 1, ctx "kvfcurve") -> crypto_box_seed_keypair (the cluster's
// one CURVE keypair: every binding socket is a server with it, every connecting socket a client
// with it and the server key); bearer token = hex(crypto_kdf(master, id 2, ctx "kvfbearr")) (only
// /metrics takes it); bootstrap MAC key = crypto_kdf(master, id 3, ctx "kvfbtmac"). The three are
// independent: one does not give another, nor the secret.
// Thread contract: derive_keys and read_secret_file are pure; cluster_keys() is thread-safe
// (computed once).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvferry/error.h"

namespace kvferry::security {

constexpr size_t kMinSecretBytes = 16;
constexpr size_t kMaxSecretBytes = 4096;
constexpr const char* kSecretFileEnv = "KVFERRY_SECRET_FILE";
constexpr const char* kSecretEnv = "KVFERRY_SECRET";

struct ClusterKeys {
  std::array<uint8_t, 32> curve_public{};
  std::array<uint8_t, 32> curve_secret{};
  std::string bearer_token;  // 64 lowercase hex digits; /metrics only
  std::array<uint8_t, 32> bootstrap_mac_key{};  // keys the bootstrap requests' MACs (core/request_mac.h)

  std::string public_key() const { return {curve_public.begin(), curve_public.end()}; }
  std::string secret_key() const { return {curve_secret.begin(), curve_secret.end()}; }
};

// The keys of `secret`. kInvalidArgument when it is shorter than kMinSecretBytes or longer than
// kMaxSecretBytes; kInternal when libsodium cannot initialise.
Result<ClusterKeys> derive_keys(std::string_view secret);

// The secret in `path`, whitespace at both ends removed. kInvalidArgument when the file cannot be
// read, is not a regular file, is accessible to group or others, or is empty.
Result<std::string> read_secret_file(const std::string& path);

// The process's keys, from the environment above, computed on first use. Ok with nullptr: no
// secret is set (authentication off). An error (bad file, short secret) is returned by every
// call, so whatever needs the keys refuses to start with that message.
Result<const ClusterKeys*> cluster_keys();

// True when `authorization` (the value of an Authorization header) is "Bearer <keys.bearer_token>",
// compared in constant time (sodium_memcmp).
bool bearer_matches(const ClusterKeys& keys, std::string_view authorization);

}  // namespace kvferry::security
