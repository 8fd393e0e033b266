// kvferry/compat.h: which fingerprints agree, and what a mismatch names.
#include "kvferry/compat.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

Compat base() {
  return {{"version", "0.1.0"},   {"min_peer_version", "0.1.0"}, {"wire", "5"},
          {"model", "Llama-3.1-8B"}, {"page_size", "16"},        {"kv_memory", "host"},
          {"memory_support", "host"}, {"tp", "prefill 2 decode 1"}};
}

Compat with(Compat c, const std::string& name, const std::string& value) {
  for (CompatField& f : c)
    if (f.name == name) f.value = value;
  return c;
}

TEST(Compat, EqualFingerprintsAgree) {
  EXPECT_FALSE(compat_mismatch(base(), base()).has_value());
  EXPECT_FALSE(compat_mismatch({}, base()).has_value());  // a rank without one compares nothing
}

TEST(Compat, TheFirstDifferingFieldIsNamedWithBothValues) {
  auto mm = compat_mismatch(base(), with(with(base(), "page_size", "32"), "tp", "prefill 1 decode 1"));
  ASSERT_TRUE(mm.has_value());
  EXPECT_EQ(mm->str(), "page_size: ours 16, theirs 32");
  auto absent = base();
  absent.erase(absent.begin() + 3);  // no model
  mm = compat_mismatch(base(), absent);
  ASSERT_TRUE(mm.has_value());
  EXPECT_EQ(mm->str(), "model: ours Llama-3.1-8B, theirs absent");
}

TEST(Compat, AFieldOnlyTheNewerPeerHasIsIgnored) {
  Compat newer = base();
  newer.push_back({"kv_checksum", "xxh3"});
  EXPECT_FALSE(compat_mismatch(base(), newer).has_value());
}

TEST(Compat, VersionsAreCheckedAsARangeEachWay) {
  // A newer peer that still accepts us.
  EXPECT_FALSE(compat_mismatch(base(), with(base(), "version", "0.2.0")).has_value());
  // A newer peer that no longer does.
  auto mm = compat_mismatch(base(), with(with(base(), "version", "0.3.0"), "min_peer_version", "0.2.0"));
  ASSERT_TRUE(mm.has_value());
  EXPECT_EQ(mm->str(), "min_peer_version: ours version 0.1.0, theirs 0.2.0");
  // An older peer than we accept.
  mm = compat_mismatch(with(with(base(), "version", "0.3.0"), "min_peer_version", "0.2.0"), base());
  ASSERT_TRUE(mm.has_value());
  EXPECT_EQ(mm->field, "version");
  EXPECT_EQ(mm->theirs, "0.1.0");
  // Not a version at all.
  EXPECT_TRUE(compat_mismatch(base(), with(base(), "version", "0.1")).has_value());
  EXPECT_TRUE(compat_mismatch(base(), with(base(), "version", "0.1.0-rc1")).has_value());
  EXPECT_TRUE(compat_mismatch(base(), with(base(), "version", "")).has_value());
}

TEST(Compat, KvMemoryNeedsABuildOnTheOtherSideThatMovesIt) {
  Compat gpu = with(with(base(), "kv_memory", "cuda"), "memory_support", "host+cuda");
  // A host-only build cannot move the peer's cuda KV, whichever side it is on.
  auto mm = compat_mismatch(base(), gpu);
  ASSERT_TRUE(mm.has_value());
  EXPECT_EQ(mm->field, "kv_memory");
  EXPECT_NE(mm->ours.find("this build moves host"), std::string::npos) << mm->str();
  mm = compat_mismatch(gpu, base());
  ASSERT_TRUE(mm.has_value());
  EXPECT_EQ(mm->field, "kv_memory");
  // Both builds move cuda: host KV on one side and cuda on the other agree.
  EXPECT_FALSE(compat_mismatch(with(base(), "memory_support", "host+cuda"), gpu).has_value());
}

TEST(Compat, BoundsAreChecked) {
  EXPECT_EQ(compat_bounds_error(base()), "");
  Compat many;
  for (size_t i = 0; i <= kMaxCompatFields; ++i) many.push_back({std::to_string(i).append("f"), "v"});
  EXPECT_NE(compat_bounds_error(many), "");
  EXPECT_NE(compat_bounds_error({{"", "v"}}), "");
  EXPECT_NE(compat_bounds_error({{"a", "v"}, {"a", "w"}}), "");
  EXPECT_NE(compat_bounds_error({{"a", std::string(kMaxCompatValueBytes + 1, 'x')}}), "");
  // Names and values go into log lines as they are: printable ASCII only.
  EXPECT_NE(compat_bounds_error({{"page_size", "16\n[error] forged"}}), "");
  EXPECT_NE(compat_bounds_error({{"page_size", "16\x1b[2J"}}), "");
  EXPECT_NE(compat_bounds_error({{"page\x7f", "16"}}), "");
}

}  // namespace
}  // namespace kvferry
