#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "kvferry/transport.h"

namespace kvferry {
namespace {

TEST(WriteOpsPool, AListGivenBackIsTakenAgainEmptyWithItsCapacity) {
  while (take_write_ops().capacity() != 0) {  // drain what other tests left
  }
  std::vector<WriteOp> ops(100000, WriteOp{1, 2, 3});
  const WriteOp* storage = ops.data();
  recycle_write_ops(std::move(ops));
  std::vector<WriteOp> again = take_write_ops();
  EXPECT_TRUE(again.empty());
  EXPECT_GE(again.capacity(), 100000u);
  EXPECT_EQ(again.data(), storage);  // the same memory: nothing mapped anew
  EXPECT_EQ(take_write_ops().capacity(), 0u);  // the pool is empty again
}

TEST(WriteOpsPool, BoundedInCountAndSize) {
  while (take_write_ops().capacity() != 0) {
  }
  recycle_write_ops(std::vector<WriteOp>(10));  // under 64 KiB: not kept
  for (int i = 0; i < 40; ++i) recycle_write_ops(std::vector<WriteOp>(5000));
  std::vector<WriteOp> huge;
  huge.reserve((64u << 20) / sizeof(WriteOp) + 1);  // over 64 MiB: not kept
  recycle_write_ops(std::move(huge));
  int kept = 0;
  for (std::vector<WriteOp> v = take_write_ops(); v.capacity() != 0; v = take_write_ops()) {
    EXPECT_EQ(v.capacity(), 5000u);
    ++kept;
  }
  EXPECT_EQ(kept, 16);
}

TEST(WriteOpsPool, ThreadsTakeAndGiveConcurrently) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 2000; ++i) {
        std::vector<WriteOp> v = take_write_ops();
        v.resize(5000, {uint64_t(i), 0, 1});
        recycle_write_ops(std::move(v));
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<WriteOp> v = take_write_ops();
  EXPECT_TRUE(v.empty());
}

}  // namespace
}  // namespace kvferry
