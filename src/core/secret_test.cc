// Cluster secret (core/secret.h): derivation is deterministic and differs per secret; the bootstrap
// MAC key is crypto_kdf(master, 3, "kvfbtmac") and independent of the token; the secret file's
// checks; the bearer comparison.
#include "core/secret.h"

#include <gtest/gtest.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace kvferry::security {
namespace {

namespace fs = std::filesystem;

TEST(Secret, DerivationIsDeterministic) {
  auto a = derive_keys("correct horse battery staple");
  auto b = derive_keys("correct horse battery staple");
  ASSERT_TRUE(a.ok()) << a.status().str();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->curve_public, b->curve_public);
  EXPECT_EQ(a->curve_secret, b->curve_secret);
  EXPECT_EQ(a->bearer_token, b->bearer_token);
  EXPECT_EQ(a->bearer_token.size(), 64u);
  EXPECT_EQ(a->bearer_token.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(Secret, EachSecretHasItsOwnKeys) {
  auto a = derive_keys("correct horse battery staple");
  auto b = derive_keys("correct horse battery stapler");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->curve_public, b->curve_public);
  EXPECT_NE(a->curve_secret, b->curve_secret);
  EXPECT_NE(a->bearer_token, b->bearer_token);
  // Distinct contexts: the token is not the CURVE seed or key material.
  std::string pub_hex;
  for (uint8_t c : a->curve_public) pub_hex += "0123456789abcdef"[c >> 4], pub_hex += "0123456789abcdef"[c & 15];
  EXPECT_NE(pub_hex, a->bearer_token);
}

// The bootstrap MAC key, computed here from the documented derivation (docs/security.md), not by
// secret.cc's code: its id and context are what the docs (and any other implementation) say.
TEST(Secret, BootstrapMacKeyIsItsOwnDerivation) {
  const std::string secret = "correct horse battery staple";
  auto k = derive_keys(secret);
  auto other = derive_keys(secret + "r");
  ASSERT_TRUE(k.ok() && other.ok());
  ASSERT_GE(sodium_init(), 0);
  const std::string master_key = "kvferry cluster secret v1";
  uint8_t master[32], want[32], token[32];
  crypto_generichash(master, sizeof master, reinterpret_cast<const uint8_t*>(secret.data()), secret.size(),
                     reinterpret_cast<const uint8_t*>(master_key.data()), master_key.size());
  ASSERT_EQ(crypto_kdf_derive_from_key(want, sizeof want, 3, "kvfbtmac", master), 0);
  EXPECT_EQ(0, std::memcmp(k->bootstrap_mac_key.data(), want, sizeof want));
  ASSERT_EQ(crypto_kdf_derive_from_key(token, sizeof token, 2, "kvfbearr", master), 0);
  char token_hex[65];
  sodium_bin2hex(token_hex, sizeof token_hex, token, sizeof token);
  EXPECT_EQ(k->bearer_token, token_hex);
  // Independent of the token and the CURVE keys, and per secret.
  EXPECT_NE(0, std::memcmp(k->bootstrap_mac_key.data(), token, sizeof token));
  EXPECT_NE(k->bootstrap_mac_key, k->curve_secret);
  EXPECT_NE(k->bootstrap_mac_key, k->curve_public);
  EXPECT_NE(k->bootstrap_mac_key, other->bootstrap_mac_key);
}

TEST(Secret, ShortAndLongSecretsAreRefused) {
  EXPECT_EQ(derive_keys("short").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(derive_keys(std::string(kMinSecretBytes - 1, 'x')).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(derive_keys(std::string(kMinSecretBytes, 'x')).ok());
  EXPECT_EQ(derive_keys(std::string(kMaxSecretBytes + 1, 'x')).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Secret, BearerComparison) {
  auto k = derive_keys("correct horse battery staple");
  ASSERT_TRUE(k.ok());
  EXPECT_TRUE(bearer_matches(*k, "Bearer " + k->bearer_token));
  EXPECT_FALSE(bearer_matches(*k, ""));
  EXPECT_FALSE(bearer_matches(*k, k->bearer_token));
  EXPECT_FALSE(bearer_matches(*k, "Basic " + k->bearer_token));
  EXPECT_FALSE(bearer_matches(*k, "Bearer " + k->bearer_token + "0"));
  std::string wrong = k->bearer_token;
  wrong.back() = wrong.back() == '0' ? '1' : '0';
  EXPECT_FALSE(bearer_matches(*k, "Bearer " + wrong));
}

class SecretFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvferry_secret_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::string& text, mode_t mode) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p;
  }
  fs::path dir_;
};

TEST_F(SecretFile, OwnerOnlyFileIsRead) {
  auto s = read_secret_file(write("ok", "  s3cret-of-the-cluster-0123\n", 0600));
  ASSERT_TRUE(s.ok()) << s.status().str();
  EXPECT_EQ(*s, "s3cret-of-the-cluster-0123");
  EXPECT_TRUE(read_secret_file(write("ro", "s3cret-of-the-cluster-0123", 0400)).ok());
}

TEST_F(SecretFile, GroupOrWorldAccessIsRefused) {
  for (mode_t m : {0640, 0604, 0660, 0644, 0610}) {
    SCOPED_TRACE(m);
    auto s = read_secret_file(write("open" + std::to_string(m), "s3cret-of-the-cluster-0123", m));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("chmod 600"), std::string::npos) << s.status().message();
  }
}

// Issue 31: a secret file of another user is refused, whatever its mode, with a clear reason.
// As root the test hands its own file to uid 65534; otherwise it reads a root-owned system file.
TEST_F(SecretFile, AnotherUsersFileIsRefused) {
  fs::path p = write("theirs", "s3cret-of-the-cluster-0123", 0600);
  uid_t owner = 65534;
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(p.c_str(), owner, static_cast<gid_t>(-1)), 0);
  } else {
    p = "/etc/hostname";
    owner = 0;
  }
  auto s = read_secret_file(p.string());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("owned by uid " + std::to_string(owner)), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("effective uid"), std::string::npos) << s.status().message();
}

TEST_F(SecretFile, MissingEmptyOrNotAFile) {
  EXPECT_EQ(read_secret_file((dir_ / "none").string()).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(read_secret_file(write("empty", " \n", 0600)).status().code(), ErrorCode::kInvalidArgument);
  const fs::path sub = dir_ / "sub";
  fs::create_directories(sub);
  ::chmod(sub.c_str(), 0700);
  EXPECT_EQ(read_secret_file(sub.string()).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvferry::security
