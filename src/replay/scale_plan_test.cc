#include "replay/scale_plan.h"

#include <gtest/gtest.h>

namespace kvferry::replay {
namespace {

TEST(ScalePlan, EmptySpecIsNoEvent) {
  auto e = parse_scale("", 1, 1);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->empty());
}

TEST(ScalePlan, ParsesSortsAndResolvesInstances) {
  auto e = parse_scale("t=40s:-decode,t=20s:+prefill,t=25.5s:+decode,t=30s:-decode", 1, 2);
  ASSERT_TRUE(e.ok()) << e.status().str();
  ASSERT_EQ(e->size(), 4u);
  EXPECT_EQ((*e)[0].str(), "t=20s:+prefill");
  EXPECT_TRUE((*e)[0].join);
  EXPECT_EQ((*e)[0].instance, 1u);  // after prefill 0
  EXPECT_DOUBLE_EQ((*e)[1].t_s, 25.5);
  EXPECT_EQ((*e)[1].instance, 2u);  // after decode 0 and 1
  EXPECT_FALSE((*e)[2].join);
  EXPECT_EQ((*e)[2].instance, 2u);  // the highest live decode index
  EXPECT_EQ((*e)[3].instance, 1u);
  EXPECT_EQ(total_instances(*e, Role::kPrefill, 1), 2u);
  EXPECT_EQ(total_instances(*e, Role::kDecode, 2), 3u);
}

TEST(ScalePlan, RefusesMalformedEvents) {
  for (const char* bad : {"t=2:+prefill", "2s:+prefill", "t=2s+prefill", "t=2s:prefill", "t=2s:+router",
                          "t=-1s:+decode", "t=xs:+decode", "t=2s:+decode,", "t=nans:+decode", "t=1e9s:+decode"}) {
    auto e = parse_scale(bad, 2, 2);
    EXPECT_FALSE(e.ok()) << bad;
    if (!e.ok()) {
      EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(e.status().message().find("--scale"), std::string::npos) << e.status().message();
    }
  }
}

TEST(ScalePlan, RefusesRemovingTheLastInstanceAndMoreThan16) {
  auto last = parse_scale("t=1s:-decode", 1, 1);
  ASSERT_FALSE(last.ok());
  EXPECT_NE(last.status().message().find("last live decode instance"), std::string::npos);
  // The join comes first in time: then the removal is allowed.
  EXPECT_TRUE(parse_scale("t=2s:-decode,t=1s:+decode", 1, 1).ok());
  EXPECT_FALSE(parse_scale("t=1s:-decode,t=2s:+decode", 1, 1).ok());
  auto many = parse_scale("t=1s:+prefill", 16, 1);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("more than 16"), std::string::npos);
  std::string spec;
  for (int i = 0; i < 33; ++i) {
    if (i > 0) spec += ',';
    spec += "t=1s:+decode";
  }
  EXPECT_FALSE(parse_scale(spec, 1, 1).ok());
}

}  // namespace
}  // namespace kvferry::replay
