// The receiver-side room fence at the endpoint level (decode_fence.cc; docs/failure-model.md "Late
// writes"): a prefill and a decode rank in one process over the tcp transport
// (endpoint_pair_test_util.h), the decode endpoint's fence installed in its transport.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "endpoint/endpoint_pair_steps.h"
#include "kvferry/fault_transport.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::decode_rank0;
using testing::make_pair;
using testing::open_room;
using testing::PairConfig;
using testing::prefill_rank0;

PairConfig tcp_pair() {
  PairConfig cfg;
  cfg.transport = "tcp";
  cfg.decode_deadlines.drain_timeout_ms = 200;
  return cfg;
}

bool chunk_done(const testing::EndpointPair& p, uint64_t tag, bool ok) {
  return std::any_of(p.chunks_done.begin(), p.chunks_done.end(),
                     [&](const ChunkDone& d) { return d.tag == tag && d.ok == ok; });
}

// A room is open from init() until every source is terminal: then no honest write can come, and
// drained() waits for the fence to be closed.
TEST(RoomFenceEndpoint, OpenFromInitUntilEverySourceIsTerminal) {
  auto p = make_pair(tcp_pair());
  ASSERT_TRUE(p);
  const uint64_t room = 0xf1;
  EXPECT_FALSE(p->decode().fence().is_open(room));
  open_room(*p, room, 48, {3, 4, 5}, 2);
  EXPECT_TRUE(p->decode().fence().is_open(room));
  ASSERT_TRUE(p->send_chunk(room, 0, {0, 1, 2}, 1).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(room) == KVPoll::Success; }, 10s));
  EXPECT_EQ(p->verify_decode(room, {3, 4, 5}), 0u);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(room, monotonic_ns()); }, 10s));
  EXPECT_FALSE(p->decode().fence().is_open(room));
  EXPECT_EQ(p->decode().fence().open_rooms(), 0u);
  EXPECT_EQ(p->decode().fence().refused(), 0u);
  p->decode().release(room);
  EXPECT_EQ(p->decode().quarantined_rooms(), 0u);  // no placement ran at the release
}

// The real scenario: a room's writes are still on their way when the decode rank gives the room
// up and its pages go to the next room (here the test reuses the quarantined pages at once, as a
// prefill's terminal status sent while bytes of a failed write were still in the network would let
// it). When the old room's write arrives after all, the fence refuses it: the new room's bytes stay
// intact, the old room's write fails at the prefill with the refusal, nothing else changes.
TEST(RoomFenceEndpoint, LateWriteForAReleasedRoomLandsNowhere) {
  auto p = make_pair(tcp_pair());
  ASSERT_TRUE(p);
  const uint64_t old_room = 0xa1, new_room = 0xb2;
  const std::vector<uint64_t> pages = {3, 4, 5};
  open_room(*p, old_room, 48, pages, 2);
  p->pcore().faults()->hold_room(old_room);
  ASSERT_TRUE(p->send_chunk(old_room, 0, {0, 1, 2}, 1).ok());  // held in flight
  p->decode().fail(old_room, ErrorCode::kAborted, "client went away", decode_rank0(), monotonic_ns(), true);
  ASSERT_TRUE(p->pump_until([&] { return p->decode().drained(old_room, monotonic_ns()); }, 10s));
  p->decode().release(old_room);
  EXPECT_FALSE(p->decode().fence().is_open(old_room));
  EXPECT_EQ(p->decode().quarantined_rooms(), 1u);

  // The same pages and aux row for the next room, from other staging pages, byte-exact.
  open_room(*p, new_room, 48, pages, 2);
  ASSERT_TRUE(p->send_chunk(new_room, 0, {6, 7, 8}, 2).ok());
  ASSERT_TRUE(p->pump_until([&] { return p->decode().poll(new_room) == KVPoll::Success; }, 10s));
  ASSERT_EQ(p->verify_decode(new_room, pages), 0u);

  // The old room's write goes out now, with the old room's bytes.
  p->pcore().faults()->release_held(old_room);
  ASSERT_TRUE(p->pump_until([&] { return chunk_done(*p, 1, false); }, 10s));
  EXPECT_FALSE(chunk_done(*p, 1, true));
  EXPECT_GE(p->decode().fence().refused_closed(), 1u);
  EXPECT_EQ(p->decode().fence().refused_outside(), 0u);
  EXPECT_EQ(p->verify_decode(new_room, pages), 0u);  // not one byte of the old room landed
  EXPECT_EQ(p->decode_aux(2).room, new_room);
  EXPECT_EQ(p->decode().poll(new_room), KVPoll::Success);
  // The failed write is the prefill's terminal answer: the old room's quarantine ends.
  ASSERT_TRUE(p->pump_until([&] { return p->decode().reclaimed_total() == 1; }, 10s));
}

// A liar with a tcp transport of its own, connected to the decode rank's transport with what a
// pool registration announces, writes into the pages of a live room: naming another room (open or
// not), or naming no open room at all. Nothing lands, the live room completes byte-exact.
TEST(RoomFenceEndpoint, ForgedWriteNamingAnotherRoomIsRefused) {
  auto p = make_pair(tcp_pair());
  ASSERT_TRUE(p);
  const uint64_t live = 0xc3, other = 0xd4;
  const std::vector<uint64_t> live_pages = {3, 4, 5}, other_pages = {9, 10};
  open_room(*p, live, 48, live_pages, 2);
  open_room(*p, other, 32, other_pages, 3);

  auto liar = make_transport("tcp");
  ASSERT_TRUE(liar.ok()) << liar.status().str();
  auto region = (*liar)->create_region(1 << 20);
  ASSERT_TRUE(region.ok());
  std::memset(region->base, 0x5a, region->bytes);
  RemoteRegionInfo info;
  info.worker_address = p->dcore().transport().address();
  for (const RegionSpan& s : p->dcore().spans()) info.spans.push_back({s.offset, s.bytes, s.base, s.packed_rkey});
  auto peer = (*liar)->connect(info);
  ASSERT_TRUE(peer.ok()) << peer.status().str();

  const MemoryShape& sh = p->dcore().shape();
  const uint64_t live_page = sh.kv(0, live_pages[0]);
  struct Wait {
    std::shared_ptr<std::promise<Status>> pr = std::make_shared<std::promise<Status>>();
    std::future<Status> f = pr->get_future();
  };
  auto forge = [&](uint64_t room, uint64_t remote, uint64_t bytes) {
    Wait w;
    (*liar)->write(*peer, room, {{0, remote, bytes}}, [pr = w.pr](Status st) { pr->set_value(std::move(st)); });
    // The decode rank's transport answers on its own thread; the test pumps nothing for it.
    EXPECT_EQ(w.f.wait_for(30s), std::future_status::ready);
    return w.f.get();
  };
  // Room `other`'s name on `live`'s pages: outside `other`'s pages.
  Status st = forge(other, live_page, sh.page_bytes);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.str();
  EXPECT_NE(st.message().find("outside room"), std::string::npos) << st.str();
  // A room that is not open here (never added, or a room id guessed wrong).
  st = forge(0xdead, live_page, sh.page_bytes);
  EXPECT_EQ(st.code(), ErrorCode::kTransferError) << st.str();
  EXPECT_NE(st.message().find("not open"), std::string::npos) << st.str();
  // A small write (a scatter message) straddling `live`'s aux row into the next row.
  if (!sh.aux_offsets.empty()) {
    st = forge(live, sh.aux(0, 2) + sh.aux_item_bytes[0] - 4, 8);
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.str();
  }
  st = forge(live, sh.guard(2) + 8, kAuxSlotBytes);  // past the end of the guard row
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.str();
  EXPECT_GE(p->decode().fence().refused(), 3u);

  // The live rooms still complete byte-exact.
  ASSERT_TRUE(p->send_chunk(live, 0, {0, 1, 2}, 1).ok());
  ASSERT_TRUE(p->send_chunk(other, 0, {6, 7}, 2).ok());
  ASSERT_TRUE(p->pump_until([&] {
    return p->decode().poll(live) == KVPoll::Success && p->decode().poll(other) == KVPoll::Success;
  }, 10s));
  EXPECT_EQ(p->verify_decode(live, live_pages), 0u);
  EXPECT_EQ(p->verify_decode(other, other_pages), 0u);
  (*liar)->disconnect(*peer);
}

}  // namespace
}  // namespace kvferry
