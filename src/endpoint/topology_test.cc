#include "endpoint/topology.h"

#include <gtest/gtest.h>

#include <map>

namespace kvferry {
namespace {

ModelGeometry gqa(uint32_t heads) { return {"gqa", "GQA", 2, 2, heads, 128, 2}; }
ModelGeometry mla() { return {"mla", "MLA", 2, 1, 1, 576, 2}; }

// Every head of every decode rank arrives exactly once.
void expect_each_head_once(const ModelGeometry& m, uint32_t ptp, uint32_t dtp) {
  auto plan = plan_transfers(m, ptp, dtp);
  ASSERT_TRUE(plan.ok()) << plan.status().str();
  for (uint32_t d = 0; d < dtp; ++d) {
    auto s = head_slice(m, dtp, d);
    std::map<uint32_t, int> got;
    for (const HeadTransfer& t : *plan)
      if (t.decode_rank == d)
        for (uint32_t h = t.first_head; h < t.first_head + t.num_heads; ++h) ++got[h];
    ASSERT_EQ(got.size(), s->count) << ptp << "->" << dtp << " d" << d;
    for (auto [h, n] : got) {
      EXPECT_EQ(n, 1);
      EXPECT_GE(h, s->first);
      EXPECT_LT(h, s->first + s->count);
    }
  }
}

TEST(Topology, EveryHeadOnceForAllTpPairs) {
  for (auto [p, d] : std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}, {1, 2}, {2, 1}, {2, 4}, {4, 2}, {4, 4}, {8, 2}, {16, 4}})
    expect_each_head_once(gqa(8), p, d);
}

TEST(Topology, PrefillTwoToDecodeFour) {
  auto plan = *plan_transfers(gqa(8), 2, 4);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[1].prefill_rank, 0u);
  EXPECT_EQ(plan[1].decode_rank, 1u);
  EXPECT_EQ(plan[1].first_head, 2u);
  EXPECT_EQ(plan[1].num_heads, 2u);
  EXPECT_EQ(dests_of(plan, 1), (std::vector<uint32_t>{2, 3}));
}

TEST(Topology, ReplicatedPrefillHeadsAreWrittenByTheLowestReplicaOnly) {
  auto plan = *plan_transfers(gqa(2), 4, 2);  // prefill ranks 0,1 hold head 0; 2,3 hold head 1
  EXPECT_EQ(sources_of(plan, 0), (std::vector<uint32_t>{0}));
  EXPECT_EQ(sources_of(plan, 1), (std::vector<uint32_t>{2}));
  EXPECT_TRUE(dests_of(plan, 1).empty());
  EXPECT_TRUE(dests_of(plan, 3).empty());
}

TEST(Topology, MlaOneSenderPerDecodeRank) {
  auto plan = *plan_transfers(mla(), 4, 2);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(sources_of(plan, 0), (std::vector<uint32_t>{0}));
  EXPECT_EQ(sources_of(plan, 1), (std::vector<uint32_t>{1}));
  EXPECT_TRUE(dests_of(plan, 2).empty());
  auto plan2 = *plan_transfers(mla(), 1, 4);
  for (uint32_t d = 0; d < 4; ++d) EXPECT_EQ(sources_of(plan2, d), (std::vector<uint32_t>{0}));
}

TEST(Topology, UnsplittableTpIsAnError) { EXPECT_FALSE(plan_transfers(gqa(8), 3, 1).ok()); }

}  // namespace
}  // namespace kvferry
