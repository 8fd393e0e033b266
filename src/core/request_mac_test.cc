// Bootstrap request MACs (core/request_mac.h): the header's strict syntax, the MAC binding method,
// target, body, ts and nonce, the window, the replay cache and its bound.
#include "core/request_mac.h"

#include <gtest/gtest.h>
#include <sodium.h>

#include <string>
#include <vector>

namespace kvferry::security {
namespace {

ClusterKeys keys_of(const std::string& secret) {
  auto k = derive_keys(secret);
  EXPECT_TRUE(k.ok()) << k.status().str();
  return k.ok() ? *k : ClusterKeys{};
}

const ClusterKeys kKeys = keys_of("request mac test secret 0123456789");
const ClusterKeys kOther = keys_of("another cluster's secret 0123456789");
constexpr int64_t kNow = 1'800'000'000;

Nonce nonce_of(uint8_t b) {
  Nonce n;
  n.fill(b);
  return n;
}

std::string header(int64_t ts, uint8_t nonce, const std::string& method = "PUT", const std::string& target = "/route",
                   const std::string& body = "{}", const ClusterKeys& k = kKeys) {
  return mac_authorization(k, method, target, body, ts, nonce_of(nonce));
}

TEST(RequestMac, HeaderRoundTrips) {
  const std::string h = header(kNow, 0xab);
  const std::string prefix = "KVF-MAC v=1,ts=1800000000,nonce=abababababababababababababababab,mac=";
  EXPECT_EQ(h.substr(0, prefix.size()), prefix);
  EXPECT_EQ(h.size(), prefix.size() + 64);
  auto p = parse_mac_header(h);
  ASSERT_TRUE(p.ok()) << p.status().str();
  EXPECT_EQ(p->ts, kNow);
  EXPECT_EQ(p->nonce, nonce_of(0xab));
  EXPECT_EQ(p->nonce_text, "abababababababababababababababab");
  EXPECT_EQ(p->mac, request_mac(kKeys, "PUT", "/route", "1800000000", p->nonce_text, "{}"));
  // A fresh nonce per call.
  EXPECT_NE(mac_authorization(kKeys, "GET", "/health", ""), mac_authorization(kKeys, "GET", "/health", ""));
}

TEST(RequestMac, EveryFieldOfTheHeaderIsChecked) {
  const std::string good = header(kNow, 1);
  auto p = parse_mac_header(good);
  ASSERT_TRUE(p.ok());
  const std::string nonce(32, '1'), mac(64, '2');
  auto with = [&](const std::string& v, const std::string& ts, const std::string& n, const std::string& m) {
    return "KVF-MAC v=" + v + ",ts=" + ts + ",nonce=" + n + ",mac=" + m;
  };
  ASSERT_TRUE(parse_mac_header(with("1", "5", nonce, mac)).ok());
  struct Case {
    std::string header;
    const char* field;
  };
  const std::vector<Case> bad = {
      {"", "missing"},
      {"Bearer " + kKeys.bearer_token, "scheme"},
      {kKeys.bearer_token, "scheme"},
      {"kvf-mac v=1,ts=5,nonce=" + nonce + ",mac=" + mac, "scheme"},
      {"KVF-MAC  v=1,ts=5,nonce=" + nonce + ",mac=" + mac, "'v'"},
      {"KVF-MAC", "scheme"},
      {"KVF-MAC ", "'v'"},
      {with("2", "5", nonce, mac), "'v'"},
      {with("", "5", nonce, mac), "'v'"},
      {"KVF-MAC ts=5,v=1,nonce=" + nonce + ",mac=" + mac, "'v'"},
      {"KVF-MAC v=1,nonce=" + nonce + ",mac=" + mac, "'ts'"},
      {with("1", "", nonce, mac), "'ts'"},
      {with("1", "-5", nonce, mac), "'ts'"},
      {with("1", "+5", nonce, mac), "'ts'"},
      {with("1", "05", nonce, mac), "'ts'"},
      {with("1", "5 ", nonce, mac), "'ts'"},
      {with("1", "0x5", nonce, mac), "'ts'"},
      {with("1", "99999999999999999999", nonce, mac), "'ts'"},
      {with("1", "9999999999999999999", nonce, mac), "'ts'"},  // 19 digits past int64_t
      {"KVF-MAC v=1,ts=5,mac=" + mac, "'nonce'"},
      {with("1", "5", nonce.substr(1), mac), "'nonce'"},
      {with("1", "5", nonce + "0", mac), "'nonce'"},
      {with("1", "5", std::string(32, 'A'), mac), "'nonce'"},
      {with("1", "5", std::string(31, '1') + "g", mac), "'nonce'"},
      {"KVF-MAC v=1,ts=5,nonce=" + nonce, "'mac'"},
      {"KVF-MAC v=1,ts=5,nonce=" + nonce + ",", "'mac'"},
      {with("1", "5", nonce, mac.substr(1)), "'mac'"},
      {with("1", "5", nonce, mac + "0"), "'mac'"},
      {with("1", "5", nonce, mac + ",x=1"), "'mac'"},
      {with("1", "5", nonce, std::string(64, 'F')), "'mac'"},
      {with("1", "5", nonce, mac + " "), "'mac'"},
  };
  for (const Case& c : bad) {
    SCOPED_TRACE(c.header);
    auto r = parse_mac_header(c.header);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << r.status().message();
  }
}

TEST(RequestMac, AValidRequestIsAcceptedOnce) {
  RequestVerifier v(kKeys);
  const std::string h = header(kNow, 1, "PUT", "/route", R"({"a":1})");
  EXPECT_EQ(v.precheck(h, kNow), MacVerdict::kOk);
  EXPECT_EQ(v.verify(h, "PUT", "/route", R"({"a":1})", kNow), MacVerdict::kOk);
  EXPECT_EQ(v.remembered(), 1u);
  EXPECT_EQ(v.verify(h, "PUT", "/route", R"({"a":1})", kNow + 1), MacVerdict::kReplayed);
  EXPECT_EQ(v.remembered(), 1u);
  EXPECT_EQ(v.refused(), 1u);
}

TEST(RequestMac, AnythingAlteredIsRefusedAndChangesNothing) {
  RequestVerifier v(kKeys);
  const std::string target = "/route?engine_id=0&dp_rank=0&tp_rank=0";
  const std::string h = header(kNow, 2, "GET", target, "");
  EXPECT_EQ(v.verify(header(kNow, 2, "GET", target, "", kOther), "GET", target, "", kNow), MacVerdict::kBadMac);
  EXPECT_EQ(v.verify(h, "PUT", target, "", kNow), MacVerdict::kBadMac);
  EXPECT_EQ(v.verify(h, "get", target, "", kNow), MacVerdict::kBadMac);
  EXPECT_EQ(v.verify(h, "GET", "/route?engine_id=0&dp_rank=0&tp_rank=1", "", kNow), MacVerdict::kBadMac);
  EXPECT_EQ(v.verify(h, "GET", "/route?engine_id=0&dp_rank=0", "", kNow), MacVerdict::kBadMac);
  EXPECT_EQ(v.verify(h, "GET", "/route", "", kNow), MacVerdict::kBadMac);
  EXPECT_EQ(v.verify(h, "GET", target, "x", kNow), MacVerdict::kBadMac);
  // The ts and nonce are covered: the same MAC under another ts or nonce is refused.
  auto p = parse_mac_header(h);
  ASSERT_TRUE(p.ok());
  const std::string mac_hex = h.substr(h.find(",mac=") + 5);
  EXPECT_EQ(v.verify("KVF-MAC v=1,ts=" + std::to_string(kNow + 1) + ",nonce=" + p->nonce_text + ",mac=" + mac_hex,
                     "GET", target, "", kNow),
            MacVerdict::kBadMac);
  EXPECT_EQ(v.verify("KVF-MAC v=1,ts=" + std::to_string(kNow) + ",nonce=" + std::string(32, '0') + ",mac=" + mac_hex,
                     "GET", target, "", kNow),
            MacVerdict::kBadMac);
  // A flipped bit anywhere in the MAC.
  for (size_t i = 0; i < mac_hex.size(); ++i) {
    std::string m = mac_hex;
    m[i] = m[i] == '0' ? '1' : '0';
    ASSERT_EQ(v.verify(h.substr(0, h.size() - 64) + m, "GET", target, "", kNow), MacVerdict::kBadMac) << i;
  }
  EXPECT_EQ(v.verify("Bearer " + kKeys.bearer_token, "GET", target, "", kNow), MacVerdict::kMalformed);
  EXPECT_EQ(v.verify("", "GET", target, "", kNow), MacVerdict::kMissing);
  EXPECT_EQ(v.remembered(), 0u);
  // None of that used the nonce up.
  EXPECT_EQ(v.verify(h, "GET", target, "", kNow), MacVerdict::kOk);
}

TEST(RequestMac, TheBodyBoundaryIsUnambiguous) {
  // Moving bytes between target and body, or between method and target, changes the MAC.
  EXPECT_NE(request_mac(kKeys, "GET", "/a", "5", "n", "b"), request_mac(kKeys, "GET", "/ab", "5", "n", ""));
  EXPECT_NE(request_mac(kKeys, "GET", "/a", "5", "n", ""), request_mac(kKeys, "GE", "T/a", "5", "n", ""));
  EXPECT_NE(request_mac(kKeys, "GET", "/a", "51", "n", ""), request_mac(kKeys, "GET", "/a", "5", "1n", ""));
}

TEST(RequestMac, TimestampsOutsideTheWindowAreStale) {
  RequestVerifier v(kKeys);
  for (int64_t ts : {kNow - kMacWindowS - 1, kNow + kMacWindowS + 1, int64_t{0}, int64_t{1} << 62}) {
    SCOPED_TRACE(ts);
    const std::string h = header(ts, 3);
    EXPECT_EQ(v.precheck(h, kNow), MacVerdict::kStale);
    EXPECT_EQ(v.verify(h, "PUT", "/route", "{}", kNow), MacVerdict::kStale);
  }
  EXPECT_EQ(v.verify(header(kNow - kMacWindowS, 4), "PUT", "/route", "{}", kNow), MacVerdict::kOk);
  EXPECT_EQ(v.verify(header(kNow + kMacWindowS, 5), "PUT", "/route", "{}", kNow), MacVerdict::kOk);
  EXPECT_EQ(v.remembered(), 2u);
  // Entries leave with their ts's window; a replay after that is stale.
  EXPECT_EQ(v.verify(header(kNow + kMacWindowS + 2, 6), "PUT", "/route", "{}", kNow + 2 * kMacWindowS + 1),
            MacVerdict::kOk);
  EXPECT_EQ(v.remembered(), 1u);
  EXPECT_EQ(v.verify(header(kNow + kMacWindowS, 5), "PUT", "/route", "{}", kNow + 2 * kMacWindowS + 1),
            MacVerdict::kStale);
}

TEST(RequestMac, TheReplayCacheIsBoundedAndNeverAcceptsAReplay) {
  constexpr size_t kCap = 8;
  RequestVerifier v(kKeys, kCap);
  std::vector<std::string> accepted;
  // 3 * kCap valid requests, ts rising: the cache holds kCap, the older ones become the floor.
  for (int i = 0; i < static_cast<int>(3 * kCap); ++i) {
    const std::string h = header(kNow - 60 + i, static_cast<uint8_t>(i));
    ASSERT_EQ(v.verify(h, "PUT", "/route", "{}", kNow), MacVerdict::kOk) << i;
    accepted.push_back(h);
    EXPECT_LE(v.remembered(), kCap);
  }
  EXPECT_EQ(v.remembered(), kCap);
  // Every one of them, replayed, is refused: the ones still held as replays, the evicted ones as
  // stale (at or below the floor).
  for (size_t i = 0; i < accepted.size(); ++i) {
    const MacVerdict r = v.verify(accepted[i], "PUT", "/route", "{}", kNow);
    EXPECT_EQ(r, i < 2 * kCap ? MacVerdict::kStale : MacVerdict::kReplayed) << i;
    EXPECT_EQ(v.precheck(accepted[i], kNow), i < 2 * kCap ? MacVerdict::kStale : MacVerdict::kOk) << i;
  }
  // A request newer than the floor still passes (the oldest entry makes room), one at the floor's
  // ts or older does not.
  EXPECT_EQ(v.verify(header(kNow, 200), "PUT", "/route", "{}", kNow), MacVerdict::kOk);
  EXPECT_EQ(v.verify(header(kNow - 60, 201), "PUT", "/route", "{}", kNow), MacVerdict::kStale);
  EXPECT_EQ(v.remembered(), kCap);
  // A request that is itself the oldest is accepted once, evicted at once, and then stale.
  RequestVerifier w(kKeys, 1);
  ASSERT_EQ(w.verify(header(kNow, 1), "PUT", "/route", "{}", kNow), MacVerdict::kOk);
  ASSERT_EQ(w.verify(header(kNow - 5, 2), "PUT", "/route", "{}", kNow), MacVerdict::kOk);
  EXPECT_EQ(w.verify(header(kNow - 5, 2), "PUT", "/route", "{}", kNow), MacVerdict::kStale);
  EXPECT_EQ(w.verify(header(kNow, 1), "PUT", "/route", "{}", kNow), MacVerdict::kReplayed);
  EXPECT_EQ(w.remembered(), 1u);
}

}  // namespace
}  // namespace kvferry::security
