// The --hosts file (hosts.h): accepted shapes, every refusal and its message, rank lookup.
#include "replay/hosts.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace kvferry::replay {
namespace {

using json = nlohmann::json;

json two_hosts() {
  return json::parse(R"({
    "hosts": {"h1": {"address": "10.71.0.1", "exec": ["ip", "netns", "exec", "kvhh1"], "links": ["eth0"]},
              "h2": {"address": "10.71.0.2", "exec": ["ip", "netns", "exec", "kvhh2"]}},
    "place": {"bootstrap": "h1", "router": "h1", "prefill": ["h1", "h1"], "decode": ["h2", "h2"]}})");
}

// parse_hosts() of `j` fails with a message containing `want`.
void expect_refused(const json& j, const std::string& want) {
  auto hf = parse_hosts(j.dump());
  ASSERT_FALSE(hf.ok()) << j.dump();
  EXPECT_EQ(hf.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(hf.status().message().find(want), std::string::npos) << hf.status().message();
}

TEST(Hosts, ParsesTheIssueShape) {
  auto hf = parse_hosts(two_hosts().dump());
  ASSERT_TRUE(hf.ok()) << hf.status().str();
  ASSERT_EQ(hf->hosts.size(), 2u);
  const HostEntry& h1 = hf->host("h1");
  EXPECT_EQ(h1.name, "h1");
  EXPECT_EQ(h1.address, "10.71.0.1");
  EXPECT_EQ(h1.exec, (std::vector<std::string>{"ip", "netns", "exec", "kvhh1"}));
  EXPECT_EQ(h1.links, std::vector<std::string>{"eth0"});
  EXPECT_TRUE(hf->host("h2").links.empty());
  EXPECT_EQ(hf->place.bootstrap, "h1");
  EXPECT_EQ(hf->place.replay, "h1");  // default: the router's host
  EXPECT_EQ(hf->bootstrap().address, "10.71.0.1");
  EXPECT_TRUE(hf->engines_apart());
}

TEST(Hosts, RanksAreDpGroupsOneAfterTheOther) {
  json j = two_hosts();
  j["hosts"]["h3"] = {{"address", "10.71.0.3"}};
  j["place"]["prefill"] = {"h1", "h2", "h3", "h1"};  // TP 2 x DP 2
  j["place"]["decode"] = {"h3", "h2", "h1"};         // TP 1 x DP 3
  j["place"]["replay"] = "h3";
  auto hf = parse_hosts(j.dump());
  ASSERT_TRUE(hf.ok()) << hf.status().str();
  ASSERT_TRUE(check_placement(*hf, 2, 2, 1, 3).ok());
  EXPECT_EQ(hf->rank(true, 0, 0).name, "h1");
  EXPECT_EQ(hf->rank(true, 1, 0).name, "h2");
  EXPECT_EQ(hf->rank(true, 0, 1).name, "h3");
  EXPECT_EQ(hf->rank(true, 1, 1).name, "h1");
  EXPECT_EQ(hf->rank(false, 0, 2).name, "h1");
  EXPECT_EQ(hf->replay().name, "h3");
  EXPECT_TRUE(hf->host("h3").exec.empty());
}

TEST(Hosts, EnginesTogetherAreNotApart) {
  json j = two_hosts();
  j["place"]["prefill"] = {"h2", "h2"};
  auto hf = parse_hosts(j.dump());
  ASSERT_TRUE(hf.ok());
  EXPECT_FALSE(hf->engines_apart());
}

TEST(Hosts, CountsMustMatchTpTimesDp) {
  auto hf = parse_hosts(two_hosts().dump());
  ASSERT_TRUE(hf.ok());
  EXPECT_TRUE(check_placement(*hf, 2, 1, 1, 2).ok());
  Status st = check_placement(*hf, 2, 2, 2, 1);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("place.prefill names 2 hosts but the prefill engine has 4 ranks (TP 2 x DP 2)"),
            std::string::npos)
      << st.message();
  st = check_placement(*hf, 2, 1, 3, 1);
  EXPECT_NE(st.message().find("place.decode names 2 hosts but the decode engine has 3 ranks"), std::string::npos)
      << st.message();
}

TEST(Hosts, RefusesUnknownKeys) {
  json j = two_hosts();
  j["hosts"]["h1"]["adress"] = "10.0.0.9";
  expect_refused(j, "unknown key 'adress' in hosts.h1 (known: address, exec, links)");
  j = two_hosts();
  j["place"]["prefil"] = {"h1"};
  expect_refused(j, "unknown key 'prefil' in place");
  j = two_hosts();
  j["extra"] = 1;
  expect_refused(j, "unknown key 'extra' in the file");
}

TEST(Hosts, RefusesUnknownHostsInPlace) {
  json j = two_hosts();
  j["place"]["decode"] = {"h2", "h9"};
  expect_refused(j, "place.decode[1] names host 'h9', which is not in \"hosts\" (hosts: h1, h2)");
  j = two_hosts();
  j["place"]["router"] = "h3";
  expect_refused(j, "place.router names host 'h3'");
  j = two_hosts();
  j["place"]["replay"] = "nowhere";
  expect_refused(j, "place.replay names host 'nowhere'");
}

TEST(Hosts, RefusesBadAddresses) {
  json j = two_hosts();
  j["hosts"]["h2"]["address"] = "0.0.0.0";
  expect_refused(j, "hosts.h2.address:");
  j["hosts"]["h2"]["address"] = "not a host";
  expect_refused(j, "hosts.h2.address:");
  j["hosts"]["h2"]["address"] = 5;
  expect_refused(j, "hosts.h2.address is required");
  j["hosts"]["h2"].erase("address");
  expect_refused(j, "hosts.h2.address is required");
  j["hosts"]["h2"]["address"] = "10.71.0.1";
  expect_refused(j, "hosts.h1 and hosts.h2 have the same address 10.71.0.1");
  j["hosts"]["h2"]["address"] = "127.0.0.2";
  expect_refused(j, "hosts.h2.address 127.0.0.2 is loopback");
  j["hosts"]["h2"]["address"] = "[fd00::2]";
  auto hf = parse_hosts(j.dump());
  ASSERT_TRUE(hf.ok()) << hf.status().str();
  EXPECT_EQ(hf->host("h2").address, "fd00::2");  // brackets removed
}

TEST(Hosts, OneLoopbackHostIsFine) {
  auto hf = parse_hosts(R"({"hosts": {"local": {"address": "127.0.0.1"}},
      "place": {"bootstrap": "local", "router": "local", "prefill": ["local"], "decode": ["local"]}})");
  ASSERT_TRUE(hf.ok()) << hf.status().str();
  EXPECT_FALSE(hf->engines_apart());
  EXPECT_TRUE(hf->host("local").exec.empty());
}

TEST(Hosts, RefusesBadShapes) {
  expect_refused(json::array(), "must be a JSON object");
  expect_refused(json::object(), "\"hosts\" is required");
  json j = two_hosts();
  j.erase("place");
  expect_refused(j, "\"place\" is required");
  j = two_hosts();
  j["place"].erase("bootstrap");
  expect_refused(j, "place.bootstrap is required");
  j = two_hosts();
  j["place"].erase("decode");
  expect_refused(j, "place.decode is required");
  j = two_hosts();
  j["place"]["prefill"] = json::array();
  expect_refused(j, "place.prefill must name one host per rank");
  j = two_hosts();
  j["place"]["prefill"] = "h1";
  expect_refused(j, "place.prefill must be an array of strings");
  j = two_hosts();
  j["hosts"]["h1"]["exec"] = {"ip", ""};
  expect_refused(j, "hosts.h1.exec[1] must be a non-empty string");
  j = two_hosts();
  j["hosts"]["h1"]["exec"] = "ip netns exec kvhh1";
  expect_refused(j, "hosts.h1.exec must be an array of strings");
  j = two_hosts();
  j["hosts"]["h1"]["links"] = {"eth0; reboot"};
  expect_refused(j, "hosts.h1.links: 'eth0; reboot' is not a link name");
  j = two_hosts();
  j["hosts"]["bad key"] = {{"address", "10.71.0.5"}};
  expect_refused(j, "host key 'bad key' must be");
  j = two_hosts();
  j["hosts"]["h1"] = "10.71.0.1";
  expect_refused(j, "hosts.h1 must be an object");
  auto hf = parse_hosts("{\"hosts\": ");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().message(), "not valid JSON");
}

TEST(Hosts, LoadNamesTheFile) {
  const std::string path = ::testing::TempDir() + "/hosts_test_" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream(path) << two_hosts().dump();
  }
  auto hf = load_hosts_file(path, 2, 1, 2, 1);
  ASSERT_TRUE(hf.ok()) << hf.status().str();
  EXPECT_EQ(hf->rank(false, 1, 0).address, "10.71.0.2");
  auto bad = load_hosts_file(path, 1, 1, 2, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("--hosts " + path + ": place.prefill names 2 hosts", 0), 0u)
      << bad.status().message();
  std::filesystem::remove(path);
  auto missing = load_hosts_file(path, 2, 1, 2, 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "--hosts " + path + ": cannot read the file");
}

TEST(Hosts, ToJsonRoundTrips) {
  auto hf = parse_hosts(two_hosts().dump());
  ASSERT_TRUE(hf.ok());
  auto again = parse_hosts(hf->to_json());
  ASSERT_TRUE(again.ok()) << again.status().str() << " " << hf->to_json();
  EXPECT_EQ(again->to_json(), hf->to_json());
  const json j = json::parse(hf->to_json());
  EXPECT_EQ(j["place"]["replay"], "h1");
  EXPECT_EQ(j["hosts"]["h1"]["links"], json::array({"eth0"}));
}

}  // namespace
}  // namespace kvferry::replay
