#include "kvferry/content.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvferry {
namespace {

ModelGeometry gqa(uint32_t head_dim = 128, uint32_t dtype_bytes = 2) {
  ModelGeometry m;
  m.name = "test";
  m.attention = "GQA";
  m.num_layers = 4;
  m.tensors_per_layer = 2;
  m.cache_heads = 8;
  m.head_dim = head_dim;
  m.dtype_bytes = dtype_bytes;
  return m;
}

PoolLayout layout(uint32_t tp, uint32_t rank, ModelGeometry m = gqa()) {
  auto l = make_layout(m, tp, rank, 16, 64ull << 20, 4);
  EXPECT_TRUE(l.ok()) << l.status().str();
  return *l;
}

TEST(Content, FillThenVerifyIsClean) {
  const PoolLayout l = layout(2, 1);
  std::vector<uint8_t> page(l.page_bytes());
  fill_page(l, 77, 5, 32, page.data());
  EXPECT_EQ(verify_page(l, 77, 5, 32, page.data()), 0u);
  // Deterministic: a second fill gives the same bytes.
  std::vector<uint8_t> again(l.page_bytes());
  fill_page(l, 77, 5, 32, again.data());
  EXPECT_EQ(page, again);
}

TEST(Content, OneFlippedByteIsOneMismatch) {
  const PoolLayout l = layout(2, 0);
  std::vector<uint8_t> page(l.page_bytes());
  fill_page(l, 1, 0, 0, page.data());
  page[1000] ^= 0x10;
  EXPECT_EQ(verify_page(l, 1, 0, 0, page.data()), 1u);
  page[l.page_bytes() - 1] ^= 0xFF;
  EXPECT_EQ(verify_page(l, 1, 0, 0, page.data()), 2u);
}

TEST(Content, WrongRoomLayerTensorTokenOrRankMismatches) {
  const PoolLayout l = layout(2, 0);
  std::vector<uint8_t> page(l.page_bytes());
  fill_page(l, 10, 2, 16, page.data());  // layer 1, tensor 0 (K)
  const uint64_t n = l.page_bytes();
  EXPECT_GT(verify_page(l, 11, 2, 16, page.data()), n / 2);  // another room
  EXPECT_GT(verify_page(l, 10, 4, 16, page.data()), n / 2);  // another layer
  EXPECT_GT(verify_page(l, 10, 3, 16, page.data()), n / 2);  // V instead of K
  EXPECT_GT(verify_page(l, 10, 2, 32, page.data()), n / 2);  // another page of tokens
  EXPECT_GT(verify_page(l, 10, 2, 17, page.data()), n / 2);  // shifted by one token
  EXPECT_GT(verify_page(layout(2, 1), 10, 2, 16, page.data()), n / 2);  // another rank's heads
}

TEST(Content, ReplicatedHeadsAgreeAcrossRanks) {
  // tp 16 over 8 heads: ranks 6 and 7 both hold head 3; rank 8 holds head 4.
  const PoolLayout a = layout(16, 6), b = layout(16, 7), c = layout(16, 8);
  std::vector<uint8_t> page(a.page_bytes());
  fill_page(a, 5, 1, 0, page.data());
  EXPECT_EQ(verify_page(b, 5, 1, 0, page.data()), 0u);
  EXPECT_GT(verify_page(c, 5, 1, 0, page.data()), 0u);
}

TEST(Content, RowTailThatIsNotAWordMultiple) {
  const PoolLayout l = layout(4, 3, gqa(/*head_dim=*/5, /*dtype_bytes=*/1));  // 5-byte rows
  ASSERT_EQ(l.token_bytes(), 10u);
  std::vector<uint8_t> page(l.page_bytes());
  fill_page(l, 9, 7, 48, page.data());
  EXPECT_EQ(verify_page(l, 9, 7, 48, page.data()), 0u);
  page[l.page_bytes() - 1] ^= 1;  // a tail byte
  page[0] ^= 1;
  EXPECT_EQ(verify_page(l, 9, 7, 48, page.data()), 2u);
  EXPECT_GT(verify_page(l, 8, 7, 48, page.data()), l.page_bytes() / 2);
}

TEST(Content, UnalignedBuffers) {
  const PoolLayout l = layout(8, 2);
  std::vector<uint8_t> raw(l.page_bytes() + 3);
  fill_page(l, 3, 1, 0, raw.data() + 3);
  EXPECT_EQ(verify_page(l, 3, 1, 0, raw.data() + 3), 0u);
}

TEST(Content, MlaLatent) {
  ModelGeometry m = gqa(576, 2);
  m.attention = "MLA";
  m.tensors_per_layer = 1;
  m.cache_heads = 1;
  const PoolLayout a = layout(8, 0, m), b = layout(8, 7, m);
  std::vector<uint8_t> page(a.page_bytes());
  fill_page(a, 12, 3, 64, page.data());
  EXPECT_EQ(verify_page(b, 12, 3, 64, page.data()), 0u);  // every rank holds the same latent
}

TEST(Content, AuxRecord) {
  const AuxRecord a = make_aux(99, 1000, 63);
  EXPECT_EQ(a.room, 99u);
  EXPECT_EQ(a.cached_tokens, 1000u);
  EXPECT_EQ(a.num_pages, 63u);
  EXPECT_LT(a.first_token_id, 1u << 17);
  const AuxRecord b = make_aux(99, 1000, 63);
  EXPECT_EQ(a.first_token_id, b.first_token_id);
}

}  // namespace
}  // namespace kvferry
