#include "endpoint/page_allocator.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

TEST(PageAllocator, LowestFirstAndAllOrNothing) {
  PageAllocator a(10);
  auto p = a.alloc(4);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_FALSE(a.alloc(7));
  EXPECT_EQ(a.free_pages(), 6u);
  a.free({1, 2});
  auto q = a.alloc(3);
  ASSERT_TRUE(q);
  EXPECT_EQ(*q, (std::vector<uint64_t>{1, 2, 4}));
}

TEST(PageAllocator, DoubleFreeAndOutOfRangeAreCountedNotApplied) {
  PageAllocator a(4);
  auto p = a.alloc(2);
  a.free(*p);
  a.free({0, 9});
  EXPECT_EQ(a.bad_frees(), 2u);
  EXPECT_EQ(a.free_pages(), 4u);
  auto all = a.alloc(4);
  ASSERT_TRUE(all);
  EXPECT_EQ(all->size(), 4u);
}

TEST(PageAllocator, SameCallsSamePages) {
  PageAllocator a(100), b(100);
  for (int i = 0; i < 20; ++i) {
    auto x = a.alloc(i % 7 + 1);
    auto y = b.alloc(i % 7 + 1);
    ASSERT_EQ(x.has_value(), y.has_value());
    if (x && i % 3 == 0) {
      a.free(*x);
      b.free(*y);
    } else if (x) {
      EXPECT_EQ(*x, *y);
    }
  }
  EXPECT_EQ(a.free_pages(), b.free_pages());
}

}  // namespace
}  // namespace kvferry
