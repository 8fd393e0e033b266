// Helpers shared by the UCX transport tests (header-only, test code only).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "kvferry/transport.h"

namespace kvferry::ucx::testing {

inline uint8_t pattern_byte(uint64_t i) {
  return static_cast<uint8_t>((i * 131 + 7) ^ (i >> 11));
}

inline void fill_pattern(uint8_t* base, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; ++i) base[i] = pattern_byte(i);
}

// The image a destination region filled with `fill` must hold after `ops` copied from a source
// region holding pattern_byte().
inline std::vector<uint8_t> expected_image(uint64_t bytes, uint8_t fill,
                                           const std::vector<WriteOp>& ops) {
  std::vector<uint8_t> img(bytes, fill);
  for (const WriteOp& op : ops) {
    for (uint64_t k = 0; k < op.length; ++k) {
      img[op.remote_offset + k] = pattern_byte(op.local_offset + k);
    }
  }
  return img;
}

// Waits for one batch's completion and counts how often `done` ran.
struct Completion {
  std::shared_ptr<std::promise<Status>> promise = std::make_shared<std::promise<Status>>();
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  std::future<Status> future = promise->get_future();

  std::function<void(Status)> callback() {
    return [p = promise, c = calls](Status s) {
      if (c->fetch_add(1) == 0) p->set_value(std::move(s));
    };
  }
  // Status, or kInternal "timeout" when nothing came within `timeout`.
  Status wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    if (future.wait_for(timeout) != std::future_status::ready) {
      return Status(ErrorCode::kInternal, "timeout");
    }
    return future.get();
  }
};

inline Status write_and_wait(Transport& t, PeerId peer, uint64_t room, std::vector<WriteOp> ops,
                             std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  Completion c;
  t.write(peer, room, std::move(ops), c.callback());
  return c.wait(timeout);
}

inline RemoteRegionInfo remote_info(const Transport& t, const LocalRegion& r) {
  return remote_info_for(t.address(), {r});
}

inline RemoteRegionInfo remote_info(const Transport& t, const std::vector<LocalRegion>& spans) {
  return remote_info_for(t.address(), spans);
}

// A writer/receiver pair of transports (fields a, b: created, owning pointers; ra, rb; peer):
// gives each a region of `region_bytes`, fills A's with the pattern and B's with `fill`, and
// connects A to B. Failures are reported as test failures; `pair` is then left partly set up.
template <class Pair>
void wire_pair(Pair& pair, uint64_t region_bytes, uint8_t fill) {
  auto ra = pair.a->create_region(region_bytes);
  auto rb = pair.b->create_region(region_bytes);
  EXPECT_TRUE(ra.ok() && rb.ok());
  if (!ra.ok() || !rb.ok()) return;
  pair.ra = ra.value();
  pair.rb = rb.value();
  fill_pattern(pair.ra.base, pair.ra.bytes);
  std::memset(pair.rb.base, fill, pair.rb.bytes);
  auto id = pair.a->connect(remote_info(*pair.b, pair.rb));
  EXPECT_TRUE(id.ok()) << id.status().str();
  if (id.ok()) pair.peer = id.value();
}

}  // namespace kvferry::ucx::testing
