#include "endpoint/coalesce.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

TEST(Coalesce, MergesRunsWhereBothSidesAdvanceByOne) {
  auto runs = coalesce_pages({0, 1, 2, 7, 8, 3}, {10, 11, 12, 13, 14, 20});
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].src, 0u);
  EXPECT_EQ(runs[0].dst, 10u);
  EXPECT_EQ(runs[0].pages, 3u);
  EXPECT_EQ(runs[1].src, 7u);
  EXPECT_EQ(runs[1].dst, 13u);
  EXPECT_EQ(runs[1].pages, 2u);
  EXPECT_EQ(runs[2].src, 3u);
  EXPECT_EQ(runs[2].dst, 20u);
  EXPECT_EQ(runs[2].pages, 1u);
}

TEST(Coalesce, DstGapBreaksRun) {
  auto runs = coalesce_pages({0, 1}, {5, 7});
  EXPECT_EQ(runs.size(), 2u);
}

TEST(Coalesce, WritesPerBufferUseEachSidesStride) {
  std::vector<PageRun> runs{{2, 5, 3}};
  auto ops = runs_to_writes(runs, 2, {100, 1000}, {100, 5000});
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].local_offset, 200u);
  EXPECT_EQ(ops[0].remote_offset, 500u);
  EXPECT_EQ(ops[0].length, 300u);
  EXPECT_EQ(ops[1].local_offset, 1200u);
  EXPECT_EQ(ops[1].remote_offset, 5500u);
}

}  // namespace
}  // namespace kvferry
