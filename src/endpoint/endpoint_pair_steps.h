// Steps shared by the endpoint pair tests (endpoint_pair_test.cc, prefill_endpoint_test.cc,
// decode_endpoint_test.cc) over testing::EndpointPair (endpoint_pair_test_util.h).
// Header-only; test thread only.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"

namespace kvferry::testing {

using namespace std::chrono_literals;

inline std::unique_ptr<EndpointPair> make_pair(const PairConfig& cfg = {}) {
  auto p = EndpointPair::create(cfg);
  EXPECT_TRUE(p.ok()) << p.status().str();
  return p.ok() ? std::move(p).value() : nullptr;
}

inline int64_t ms_since(int64_t t0_ns) { return (monotonic_ns() - t0_ns) / 1'000'000; }

inline std::vector<uint64_t> iota_pages(uint64_t first, uint64_t n) {
  std::vector<uint64_t> v;
  for (uint64_t i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

// Adds the room on both sides, sends decode's metadata and waits until prefill has it.
inline void open_room(EndpointPair& p, uint64_t room, uint64_t tokens, const std::vector<uint64_t>& kv, uint32_t slot) {
  p.prefill().add_room(room, tokens);
  p.decode().add_room(room, tokens);
  ASSERT_TRUE(p.decode().init(room, kv, slot).ok());
  ASSERT_TRUE(p.pump_until([&] { return p.prefill().poll(room) == KVPoll::WaitingForInput; }, 2s))
      << "prefill state " << to_string(p.prefill().poll(room));
}

// A whole room from staging pages 0.. to `kv`, until decode reports Success.
inline void transfer_room(EndpointPair& p, uint64_t room, uint64_t tokens, const std::vector<uint64_t>& kv,
                   uint32_t slot) {
  open_room(p, room, tokens, kv, slot);
  ASSERT_TRUE(p.send_chunk(room, 0, iota_pages(0, kv.size()), room).ok());
  ASSERT_TRUE(p.pump_until([&] { return p.decode().poll(room) == KVPoll::Success; }, 5s))
      << "decode state " << to_string(p.decode().poll(room));
  EXPECT_EQ(p.verify_decode(room, kv), 0u);
}


// The registration the pair's decode rank sends (what DecodeEndpoint::send_registration builds),
// for a test to tamper with: e.g. a liar's copy with another incarnation or endpoint.
inline PoolRegistration decode_registration(EndpointPair& p) {
  const MemoryShape& sh = p.dcore().shape();
  PoolRegistration r;
  r.sender = p.dcore().self();
  r.incarnation = p.dcore().incarnation();
  r.peer_incarnation = p.pcore().incarnation();
  r.control_endpoint = p.dcore().control_endpoint();
  r.worker_address = p.dcore().transport().address();
  r.spans = p.dcore().spans();
  r.page_size = sh.page_size;
  r.page_bytes = sh.page_bytes;
  r.num_pages = sh.num_pages;
  r.kv_offsets = sh.kv_offsets;
  r.aux_offsets = sh.aux_offsets;
  r.aux_item_bytes = sh.aux_item_bytes;
  r.aux_rows = sh.aux_rows;
  r.state_offsets = sh.state_offsets;
  r.state_item_bytes = sh.state_item_bytes;
  r.state_rows = sh.state_rows;
  r.guard_offset = sh.guard_offset;
  r.heads_per_rank = p.dcore().layout().heads_per_rank;
  r.first_head = p.dcore().layout().first_head;
  return r;
}

}  // namespace kvferry::testing
