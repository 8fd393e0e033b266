// Recycled op lists (kvferry/transport.h take_write_ops / recycle_write_ops).
#include <mutex>
#include <vector>

#include "kvferry/transport.h"

namespace kvferry {
namespace {

constexpr size_t kMaxLists = 16;
constexpr size_t kMaxListBytes = 64u << 20;
// Smaller lists come from the heap cheaply (glibc maps allocations from 128 KiB on); kept, they would
// crowd out the large ones a fragmented chunk needs.
constexpr size_t kMinListBytes = 64u << 10;

struct Pool {
  std::mutex mu;
  std::vector<std::vector<WriteOp>> lists;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: transports may give lists back during exit
  return *p;
}

}  // namespace

std::vector<WriteOp> take_write_ops() {
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  if (p.lists.empty()) return {};
  std::vector<WriteOp> v = std::move(p.lists.back());
  p.lists.pop_back();
  return v;
}

void recycle_write_ops(std::vector<WriteOp>&& ops) {
  const size_t bytes = ops.capacity() * sizeof(WriteOp);
  if (bytes < kMinListBytes || bytes > kMaxListBytes) return;
  ops.clear();
  Pool& p = pool();
  std::lock_guard lock(p.mu);
  if (p.lists.size() < kMaxLists) p.lists.push_back(std::move(ops));
}

}  // namespace kvferry
