// Cluster secret and key derivation (secret.h).
#include "core/secret.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

namespace kvferry::security {
namespace {

constexpr std::string_view kMasterKey = "kvferry cluster secret v1";
constexpr uint64_t kCurveSubkey = 1;
constexpr uint64_t kBearerSubkey = 2;
constexpr uint64_t kBootstrapMacSubkey = 3;
constexpr char kCurveContext[crypto_kdf_CONTEXTBYTES + 1] = "kvfcurve";
constexpr char kBearerContext[crypto_kdf_CONTEXTBYTES + 1] = "kvfbearr";
constexpr char kBootstrapMacContext[crypto_kdf_CONTEXTBYTES + 1] = "kvfbtmac";
static_assert(crypto_kdf_KEYBYTES == 32 && crypto_box_SEEDBYTES == 32 && crypto_box_PUBLICKEYBYTES == 32 &&
              crypto_box_SECRETKEYBYTES == 32);

std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string mode_text(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

}  // namespace

Result<ClusterKeys> derive_keys(std::string_view secret) {
  if (secret.size() < kMinSecretBytes)
    return Status(ErrorCode::kInvalidArgument, "cluster secret: shorter than " + std::to_string(kMinSecretBytes) +
                                                   " bytes (use e.g. `head -c 32 /dev/urandom | base64`)");
  if (secret.size() > kMaxSecretBytes)
    return Status(ErrorCode::kInvalidArgument,
                  "cluster secret: longer than " + std::to_string(kMaxSecretBytes) + " bytes");
  if (sodium_init() < 0) return Status(ErrorCode::kInternal, "cluster secret: libsodium failed to initialise");
  uint8_t master[crypto_kdf_KEYBYTES];
  crypto_generichash(master, sizeof master, reinterpret_cast<const uint8_t*>(secret.data()), secret.size(),
                     reinterpret_cast<const uint8_t*>(kMasterKey.data()), kMasterKey.size());
  ClusterKeys k;
  uint8_t seed[crypto_box_SEEDBYTES];
  uint8_t token[32];
  crypto_kdf_derive_from_key(seed, sizeof seed, kCurveSubkey, kCurveContext, master);
  crypto_kdf_derive_from_key(token, sizeof token, kBearerSubkey, kBearerContext, master);
  crypto_kdf_derive_from_key(k.bootstrap_mac_key.data(), k.bootstrap_mac_key.size(), kBootstrapMacSubkey,
                             kBootstrapMacContext, master);
  crypto_box_seed_keypair(k.curve_public.data(), k.curve_secret.data(), seed);
  char hex[sizeof token * 2 + 1];
  sodium_bin2hex(hex, sizeof hex, token, sizeof token);
  k.bearer_token = hex;
  sodium_memzero(master, sizeof master);
  sodium_memzero(seed, sizeof seed);
  sodium_memzero(token, sizeof token);
  return k;
}

Result<std::string> read_secret_file(const std::string& path) {
  auto fail = [&](const std::string& why) {
    return Status(ErrorCode::kInvalidArgument, "cluster secret file " + path + ": " + why);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return fail(std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return fail(std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail("not a regular file");
  }
  if (st.st_uid != ::geteuid()) {
    ::close(fd);
    return fail("owned by uid " + std::to_string(st.st_uid) + ", not by this process's effective uid " +
                std::to_string(::geteuid()) + "; the secret file must belong to the user that runs the rank");
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    ::close(fd);
    return fail("mode " + mode_text(st.st_mode) + " lets group or others access it; chmod 600 it");
  }
  std::string data;
  char buf[1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return fail(std::strerror(e));
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > 4 * kMaxSecretBytes) {
      ::close(fd);
      return fail("too large for a secret");
    }
  }
  ::close(fd);
  std::string secret(trim(data));
  sodium_memzero(data.data(), data.size());
  if (secret.empty()) return fail("empty");
  return secret;
}

Result<const ClusterKeys*> cluster_keys() {
  static std::once_flag once;
  static std::optional<Status> error;
  static std::optional<ClusterKeys> keys;
  std::call_once(once, [] {
    std::string secret;
    if (const char* file = env(kSecretFileEnv)) {
      auto s = read_secret_file(file);
      if (!s.ok()) {
        error = Status(s.status().code(), std::string(kSecretFileEnv) + ": " + s.status().message());
        return;
      }
      secret = std::move(*s);
    } else if (const char* value = env(kSecretEnv)) {
      secret = value;
    } else {
      return;  // authentication off
    }
    auto k = derive_keys(secret);
    sodium_memzero(secret.data(), secret.size());
    if (!k.ok()) {
      error = k.status();
      return;
    }
    keys = std::move(*k);
  });
  if (error) return *error;
  return keys ? &*keys : static_cast<const ClusterKeys*>(nullptr);
}

bool bearer_matches(const ClusterKeys& keys, std::string_view authorization) {
  constexpr std::string_view kScheme = "Bearer ";
  if (authorization.size() != kScheme.size() + keys.bearer_token.size()) return false;
  if (authorization.substr(0, kScheme.size()) != kScheme) return false;
  return sodium_memcmp(authorization.data() + kScheme.size(), keys.bearer_token.data(), keys.bearer_token.size()) ==
         0;
}

}  // namespace kvferry::security
