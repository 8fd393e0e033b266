// The public Manager (kvferry/manager.h): a prefill and a decode manager in one process, over shm
// and tcp, caller-pumped and with their own progress threads: rooms end to end with every byte
// verified, aborts on either side with the failure record on both, release_safe() while a
// prefill write can still land, and the refused calls.
#include "kvferry/manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/bootstrap.h"
#include "kvferry/content.h"
#include "manager/manager_internal.h"
#include "manager/manager_pair_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using namespace kvferry::testing;

// A poll that concludes the room itself (its inline progress took in the last completions, before
// the progress step's housekeeping ran) sets the room's done instant, so an engine that closes the
// room at once (SGLang's clear() at Success, then get_transfer_metric()) still reads a transfer
// latency. Here the caller-pumped prefill is never pumped after its last send: only its poll()s see
// the completions.
TEST(ManagerMetrics, APollThatConcludesTheRoomSetsItsDoneInstant) {
  auto r = make_ranks("shm", false);
  ASSERT_TRUE(r);
  const uint64_t room = 78;
  const std::vector<uint64_t> src{3, 1, 4, 0, 2}, dst{9, 5, 12, 7, 6};
  auto rx = r->decode->receiver(room);
  ASSERT_TRUE(rx.ok()) << rx.status().str();
  auto tx = r->prefill->sender(room);
  ASSERT_TRUE(tx.ok()) << tx.status().str();
  ASSERT_TRUE((*rx)->init(-1).ok());
  ASSERT_TRUE((*rx)->send_metadata(dst, 11, {}, 70).ok());
  ASSERT_TRUE((*tx)->init(5, 0, 70).ok());
  ASSERT_TRUE(r->until([&] { return (*tx)->poll() == KVPoll::WaitingForInput; }));
  fill(*r->prefill, room, 0, src);
  ASSERT_TRUE((*tx)->send(src, {}, true).ok());
  ASSERT_TRUE(r->until([&] { return (*tx)->poll() == KVPoll::Success; }, 10s, [&] { r->decode->progress(); }))
      << "prefill " << to_string((*tx)->poll());
  const TransferMetrics m = (*tx)->metrics();
  EXPECT_GT(m.first_send_ns, 0);
  EXPECT_GE(m.done_ns, m.first_send_ns);
  EXPECT_GT(m.latency_s(), 0);
}

// The control plane's cost (ManagerStats control_*, heartbeats_sent; docs/BENCHMARKS.md "Control
// plane"): a room's messages are counted on both sides, and each side heartbeats its peer.
TEST(ManagerMetrics, ControlPlaneFramesAndHeartbeatsAreCounted) {
  auto r = make_ranks("shm", true);
  ASSERT_TRUE(r);
  const ManagerStats p0 = r->prefill->stats(), d0 = r->decode->stats();
  EXPECT_GT(d0.control_frames_sent, 0u);  // its pool registration
  EXPECT_GT(p0.control_frames_received, 0u);
  const uint64_t room = 79;
  const std::vector<uint64_t> src{3, 1}, dst{9, 5};
  auto rx = r->decode->receiver(room).value();
  auto tx = r->prefill->sender(room).value();
  ASSERT_TRUE(rx->init(-1).ok());
  ASSERT_TRUE(rx->send_metadata(dst, 11, {}, 32).ok());
  ASSERT_TRUE(tx->init(2, 0, 32).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  fill(*r->prefill, room, 0, src);
  ASSERT_TRUE(tx->send(src, {}, true).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Success && rx->poll() == KVPoll::Success; }));
  // Heartbeats go out every heartbeat_interval to each watched peer.
  ASSERT_TRUE(r->until([&] { return r->prefill->stats().heartbeats_sent > 0 && r->decode->stats().heartbeats_sent > 0; }));
  const ManagerStats p1 = r->prefill->stats(), d1 = r->decode->stats();
  EXPECT_GT(d1.control_frames_sent, d0.control_frames_sent);      // metadata
  EXPECT_GT(p1.control_frames_sent, p0.control_frames_sent);      // the room's status
  EXPECT_GT(p1.control_frames_received, p0.control_frames_received);
  EXPECT_GT(d1.control_bytes_received, d0.control_bytes_received);
  EXPECT_GE(p1.control_bytes_sent, p1.control_frames_sent);
}

class ManagerPair : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(ManagerPair, RoomEndToEndInChunksWithAnEmptyLastChunk) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread);
  ASSERT_TRUE(r);
  const uint64_t room = 77;
  const std::vector<uint64_t> src{3, 1, 4, 0, 2}, dst{9, 5, 12, 7, 6};
  auto rx = r->decode->receiver(room);
  ASSERT_TRUE(rx.ok()) << rx.status().str();
  auto tx = r->prefill->sender(room);
  ASSERT_TRUE(tx.ok()) << tx.status().str();
  ASSERT_TRUE((*rx)->init(-1).ok());
  ASSERT_TRUE((*rx)->send_metadata(dst, 11, {}, 70).ok());
  ASSERT_TRUE((*tx)->init(5, 0, 70).ok());
  ASSERT_TRUE(r->until([&] { return (*tx)->poll() == KVPoll::WaitingForInput; }));
  fill(*r->prefill, room, 0, src);
  ASSERT_TRUE((*tx)->send(std::span(src).first(3), {}, false).ok());
  ASSERT_TRUE((*tx)->send(std::span(src).subspan(3), {}, false).ok());
  ASSERT_TRUE((*tx)->send({}, {}, true).ok());
  ASSERT_TRUE(r->until([&] { return (*rx)->poll() == KVPoll::Success && (*tx)->poll() == KVPoll::Success; }))
      << "prefill " << to_string((*tx)->poll()) << ", decode " << to_string((*rx)->poll());
  EXPECT_EQ(mismatched(*r->decode, room, dst), 0u);
  AuxRecord aux;
  std::memcpy(&aux, r->decode->pool_base() + r->decode->layout().aux_offset(11), sizeof aux);
  EXPECT_EQ(aux.room, room);
  EXPECT_EQ(aux.cached_tokens, 70u);
  EXPECT_TRUE((*rx)->release_safe());
  EXPECT_FALSE((*rx)->quarantined());
  EXPECT_TRUE(r->until([&] { return (*tx)->release_safe(); }));
  EXPECT_FALSE((*tx)->failure());
  EXPECT_FALSE((*rx)->failure());
  TransferMetrics m = (*tx)->metrics();
  EXPECT_GT(m.bytes, r->prefill->layout().bytes_for_pages(5)) << "the KV bytes of 5 pages and the aux record";
  EXPECT_LE(m.bytes, r->prefill->layout().bytes_for_pages(5) + kAuxSlotBytes);
  EXPECT_GT(m.first_send_ns, 0);
  EXPECT_GE(m.done_ns, m.first_send_ns);
  EXPECT_EQ((*rx)->metrics().bytes, r->decode->layout().bytes_for_pages(5));
  // Dropped handles release their rooms.
  tx->reset();
  rx->reset();
  EXPECT_TRUE(r->until([&] { return r->prefill->stats().live_rooms == 0 && r->decode->stats().live_rooms == 0; }));
  EXPECT_GT(r->prefill->stats().transport.bytes_written, 0u);
  // Over tcp the decode rank opened the data connection (the prefill's bootstrap entry names its
  // transport), so the prefill writes over a socket its own listener accepted (docs/transport.md).
  EXPECT_EQ(r->decode->stats().transport.reverse_peers, transport == "tcp" ? 1u : 0u);
  EXPECT_EQ(r->prefill->stats().transport.reverse_peers, 0u);
}

TEST_P(ManagerPair, PrefillAbortIsReportedOnBothSidesWithItsOrigin) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread);
  ASSERT_TRUE(r);
  auto rx = r->decode->receiver(5).value();
  auto tx = r->prefill->sender(5).value();
  ASSERT_TRUE(rx->send_metadata(std::vector<uint64_t>{0, 1}, 0, {}).ok());
  ASSERT_TRUE(tx->init(2, 0).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  tx->abort("engine shutting down");
  EXPECT_EQ(tx->poll(), KVPoll::Failed);
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Failed && rx->release_safe(); }));
  auto pe = tx->failure(), de = rx->failure();
  ASSERT_TRUE(pe && de);
  EXPECT_EQ(pe->code, ErrorCode::kAborted);
  EXPECT_EQ(pe->origin, r->prefill->self());
  EXPECT_FALSE(pe->is_from_another_rank);
  EXPECT_EQ(de->code, ErrorCode::kAborted);
  EXPECT_EQ(de->origin, r->prefill->self());
  EXPECT_TRUE(de->is_from_another_rank);
  EXPECT_EQ(de->failure_reason, "engine shutting down");
  EXPECT_FALSE(rx->quarantined());
  // A call on a failed room is not an error and sends nothing.
  EXPECT_TRUE(tx->send(std::vector<uint64_t>{0, 1}, {}, true).ok());
}

TEST_P(ManagerPair, DecodeAbortIsReportedOnBothSidesWithItsOrigin) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread);
  ASSERT_TRUE(r);
  auto rx = r->decode->receiver(6).value();
  auto tx = r->prefill->sender(6).value();
  ASSERT_TRUE(tx->init(3, 0).ok());
  ASSERT_TRUE(rx->send_metadata(std::vector<uint64_t>{4, 5, 6}, 2, {}).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  rx->abort("client went away");
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed && rx->release_safe(); }));
  auto pe = tx->failure(), de = rx->failure();
  ASSERT_TRUE(pe && de);
  EXPECT_EQ(de->origin, r->decode->self());
  EXPECT_FALSE(de->is_from_another_rank);
  EXPECT_EQ(pe->code, ErrorCode::kAborted);
  EXPECT_EQ(pe->origin, r->decode->self());
  EXPECT_TRUE(pe->is_from_another_rank);
  EXPECT_EQ(pe->failure_reason, "client went away");
}

// Issue 30, item 2: a request aborted after init() resolved its prefill sources and before it had
// pages for send_metadata (SGLang's decode prealloc queue: it waits for memory, then
// DecodePreallocQueue handles AbortReq). The abort reaches the prefill rank at once: its sender
// fails with the decode rank's abort as cause (not a bootstrap timeout, an hour away here), and the
// receiver is release-safe (no page was given out).
TEST_P(ManagerPair, AbortBeforeMetadataReachesEveryPrefillSource) {
  auto [transport, thread] = GetParam();
  Deadlines d;
  d.bootstrap_timeout_ms = 3'600'000;
  auto r = make_ranks(transport, thread, d);
  ASSERT_TRUE(r);
  auto rx = r->decode->receiver(16).value();
  auto tx = r->prefill->sender(16).value();
  ASSERT_TRUE(rx->init(-1).ok());
  rx->abort("client went away while waiting for memory");
  EXPECT_EQ(rx->poll(), KVPoll::Failed);
  EXPECT_TRUE(rx->release_safe());
  // SGLang's prefill inits once the decode side answered (here: with its failure), then sees Failed.
  ASSERT_TRUE(r->until([&] { return tx->poll() != KVPoll::Bootstrapping; }, 20s));
  if (tx->poll() == KVPoll::WaitingForInput) {
    ASSERT_TRUE(tx->init(3, 0).ok());
  }
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed; }, 20s));
  auto pe = tx->failure();
  ASSERT_TRUE(pe);
  EXPECT_EQ(pe->code, ErrorCode::kAborted);
  EXPECT_EQ(pe->origin, r->decode->self());
  EXPECT_TRUE(pe->is_from_another_rank);
  EXPECT_EQ(pe->failure_reason, "client went away while waiting for memory");
  EXPECT_TRUE(r->until([&] { return tx->release_safe(); }));
}

// SGLang's prefill (disaggregation/prefill.py, PrefillBootstrapQueue.pop_bootstrapped) init()s a
// sender only once its poll said WaitingForInput, and fails a request it drops before that (an
// abort while bootstrapping) without calling init(). The decode rank that asked must hear of it,
// not wait out its waiting_timeout (1 h here: the notice is the only route).
TEST_P(ManagerPair, PrefillAbortBeforeInitReachesDecode) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto [rx, tx] = asked_room(*r, 17, {0, 1, 2}, 3);
  ASSERT_TRUE(rx && tx);
  tx->abort("request dropped before init");
  EXPECT_EQ(tx->poll(), KVPoll::Failed);
  EXPECT_FALSE(tx->init(3, 0).ok()) << "init() after the abort is refused";
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Failed; }, 20s));
  auto de = rx->failure();
  ASSERT_TRUE(de);
  EXPECT_EQ(de->code, ErrorCode::kAborted);
  EXPECT_EQ(de->origin, r->prefill->self());
  EXPECT_TRUE(de->is_from_another_rank);
  EXPECT_EQ(de->failure_reason, "request dropped before init");
  EXPECT_TRUE(r->until([&] { return rx->release_safe() && tx->release_safe(); }, 20s));
  EXPECT_FALSE(rx->quarantined()) << "prefill wrote nothing and said so: the pages are not quarantined";
}

// A sender that is never init()ed because decode never asks (its request went elsewhere, its
// decode rank never came) fails at its bootstrap deadline, counted from its creation, as an
// initialized room does; a decode rank that asks afterwards is answered with that cause.
TEST_P(ManagerPair, SenderNeverInitedFailsAtItsBootstrapDeadline) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only(300));
  ASSERT_TRUE(r);
  auto tx = r->prefill->sender(18).value();
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed; }, 20s));
  auto pe = tx->failure();
  ASSERT_TRUE(pe);
  EXPECT_EQ(pe->code, ErrorCode::kBootstrapTimeout);
  EXPECT_EQ(pe->origin, r->prefill->self());
  EXPECT_FALSE(pe->is_from_another_rank);
  auto rx = r->decode->receiver(18).value();
  ASSERT_TRUE(rx->init(-1).ok());
  ASSERT_TRUE(rx->send_metadata(std::vector<uint64_t>{0, 1, 2}, 3, {}).ok());
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Failed; }, 20s));
  auto de = rx->failure();
  ASSERT_TRUE(de);
  EXPECT_EQ(de->code, ErrorCode::kBootstrapTimeout);
  EXPECT_EQ(de->origin, r->prefill->self());
  EXPECT_TRUE(r->until([&] { return rx->release_safe() && tx->release_safe(); }, 20s));

  // The metadata came, the engine never init()ed: the reason says so; init() then is refused.
  auto rx2 = r->decode->receiver(20).value();
  ASSERT_TRUE(rx2->init(-1).ok());
  ASSERT_TRUE(rx2->send_metadata(std::vector<uint64_t>{4, 5}, 5, {}).ok());
  auto tx2 = r->prefill->sender(20).value();
  ASSERT_TRUE(r->until([&] { return tx2->poll() == KVPoll::Failed; }, 20s));
  ASSERT_TRUE(tx2->failure());
  EXPECT_NE(tx2->failure()->failure_reason.find("metadata came"), std::string::npos) << tx2->failure()->failure_reason;
  Status st = tx2->init(2, 0);
  EXPECT_NE(st.message().find("after the room failed"), std::string::npos) << st.str();
}

// A prefill engine that drops a sender before init() without failing it (it gave the request up)
// fails the room: the decode rank that asked is told, not left to its waiting_timeout (1 h here).
// And a sender that had decode's metadata but was never init()ed says so at its deadline.
TEST_P(ManagerPair, SenderDroppedBeforeInitFailsTheRoomForDecode) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto [rx, tx] = asked_room(*r, 19, {0, 1}, 4);
  ASSERT_TRUE(rx && tx);
  tx.reset();
  ASSERT_TRUE(r->until([&] { return rx->poll() == KVPoll::Failed; }, 20s));
  auto de = rx->failure();
  ASSERT_TRUE(de);
  EXPECT_EQ(de->code, ErrorCode::kAborted);
  EXPECT_EQ(de->origin, r->prefill->self());
  EXPECT_NE(de->failure_reason.find("dropped before init()"), std::string::npos) << de->failure_reason;
  EXPECT_TRUE(r->until([&] { return rx->release_safe(); }, 20s));
  EXPECT_FALSE(rx->quarantined());
  rx.reset();
  EXPECT_TRUE(r->until([&] { return r->prefill->stats().live_rooms == 0 && r->decode->stats().live_rooms == 0; }, 20s));
}

// The decode side of the same: a receiver dropped after init() (its sources known) but before
// send_metadata() (SGLang: a request dropped while it waited for memory), without abort(): the
// prefill source is told, not left to its bootstrap deadline (1 h here).
TEST_P(ManagerPair, ReceiverDroppedBeforeMetadataFailsTheRoomForPrefill) {
  auto [transport, thread] = GetParam();
  auto r = make_ranks(transport, thread, notice_only());
  ASSERT_TRUE(r);
  auto rx = r->decode->receiver(21).value();
  auto tx = r->prefill->sender(21).value();
  ASSERT_TRUE(rx->init(-1).ok());
  rx.reset();
  ASSERT_TRUE(r->until([&] { return tx->poll() != KVPoll::Bootstrapping; }, 20s));
  if (tx->poll() == KVPoll::WaitingForInput) {
    ASSERT_TRUE(tx->init(2, 0).ok());
  }
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed; }, 20s));
  auto pe = tx->failure();
  ASSERT_TRUE(pe);
  EXPECT_EQ(pe->code, ErrorCode::kAborted);
  EXPECT_EQ(pe->origin, r->decode->self());
  EXPECT_NE(pe->failure_reason.find("dropped before send_metadata()"), std::string::npos) << pe->failure_reason;
  EXPECT_TRUE(r->until([&] { return tx->release_safe(); }, 20s));
  tx.reset();
  EXPECT_TRUE(r->until([&] { return r->prefill->stats().live_rooms == 0 && r->decode->stats().live_rooms == 0; }, 20s));
}

INSTANTIATE_TEST_SUITE_P(Transports, ManagerPair,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_Thread" : "_Pumped");
                         });

// Decode fails the room while a prefill chunk is in flight and prefill is held back (not pumped:
// its completions and the failure notice wait): Failed, but not release-safe, until prefill's
// terminal status says no write can land any more.
TEST(Manager, ReleaseSafeStaysFalseWhileAPrefillWriteCanLand) {
  auto r = make_ranks("shm", false);
  ASSERT_TRUE(r);
  auto rx = r->decode->receiver(8).value();
  auto tx = r->prefill->sender(8).value();
  const std::vector<uint64_t> pages{0, 1, 2, 3};
  ASSERT_TRUE(tx->init(4, 0).ok());
  ASSERT_TRUE(rx->send_metadata(pages, 1, {}).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  fill(*r->prefill, 8, 0, pages);
  ASSERT_TRUE(tx->send(std::span(pages).first(2), {}, false).ok());
  rx->abort("decode gives up");
  EXPECT_EQ(rx->poll(), KVPoll::Failed);
  auto decode_only = [&] { r->decode->progress(); };
  r->until([] { return false; }, 200ms, decode_only);
  EXPECT_EQ(rx->poll(), KVPoll::Failed);
  EXPECT_FALSE(rx->release_safe()) << "a prefill write of the room can still land";
  EXPECT_FALSE(tx->release_safe());
  ASSERT_TRUE(r->until([&] { return rx->release_safe(); }));
  EXPECT_FALSE(rx->quarantined());
  EXPECT_EQ(tx->poll(), KVPoll::Failed);
  EXPECT_TRUE(r->until([&] { return tx->release_safe(); }));
}

// Sender::take_completed_sends (kvferry/manager.h), the per-chunk completion event a staging ring
// needs: a send's number comes back once, only after its writes ended (held in flight here, so the
// window is certain), a send that wrote nothing at once, and a failed room's sends once given up.
TEST(Manager, CompletedSendsComeBackOnceEachWhenTheirWritesEnded) {
  auto r = make_ranks("shm", false);
  ASSERT_TRUE(r);
  auto rx = r->decode->receiver(9).value();
  auto tx = r->prefill->sender(9).value();
  const std::vector<uint64_t> pages{0, 1, 2, 3};
  ASSERT_TRUE(rx->send_metadata(pages, 1, {}).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  ASSERT_TRUE(tx->init(4, 0).ok());
  fill(*r->prefill, 9, 0, pages);
  r->prefill->faults()->hold_room(9);
  ASSERT_TRUE(tx->send(std::span(pages).first(2), {}, false).ok());   // send 0
  ASSERT_TRUE(tx->send(std::span(pages).subspan(2), {}, false).ok());  // send 1
  ASSERT_TRUE(tx->send({}, {}, true).ok());                            // send 2: no pages
  std::vector<uint64_t> done;
  auto take = [&] {
    for (uint64_t n : tx->take_completed_sends()) done.push_back(n);
  };
  ASSERT_TRUE(r->until([&] { return r->prefill->faults()->queued_writes(9) > 0; }));
  r->until([] { return false; }, 100ms);
  take();
  EXPECT_EQ(done, std::vector<uint64_t>{2}) << "the first two sends' writes are held; the last send has no pages";
  r->prefill->faults()->release_held(9);
  ASSERT_TRUE(r->until([&] {
    take();
    return done.size() >= 3 && tx->poll() == KVPoll::Success;
  }));
  std::sort(done.begin(), done.end());
  EXPECT_EQ(done, (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_TRUE(tx->take_completed_sends().empty()) << "each number comes back once";
  EXPECT_EQ(mismatched(*r->decode, 9, pages), 0u);

  // A failed room: the writes in flight end (given up or completed), later sends end at once.
  auto rx2 = r->decode->receiver(10).value();
  auto tx2 = r->prefill->sender(10).value();
  ASSERT_TRUE(rx2->send_metadata(pages, 2, {}).ok());
  ASSERT_TRUE(r->until([&] { return tx2->poll() == KVPoll::WaitingForInput; }));
  ASSERT_TRUE(tx2->init(4, 0).ok());
  r->prefill->faults()->hold_room(10);
  ASSERT_TRUE(tx2->send(std::span(pages).first(2), {}, false).ok());  // send 0, held
  tx2->abort("prefill gives up");
  ASSERT_TRUE(tx2->send(std::span(pages).subspan(2), {}, true).ok());  // send 1: the room failed
  EXPECT_EQ(tx2->take_completed_sends(), std::vector<uint64_t>{1});
  EXPECT_FALSE(tx2->release_safe()) << "send 0's writes are still held";
  r->prefill->faults()->release_held(10);
  std::vector<uint64_t> done2;
  ASSERT_TRUE(r->until([&] {
    for (uint64_t n : tx2->take_completed_sends()) done2.push_back(n);
    return !done2.empty() && tx2->release_safe();
  }));
  EXPECT_EQ(done2, std::vector<uint64_t>{0});
}

TEST(Manager, BadCallsAreRefusedNamingTheValue) {
  auto r = make_ranks("shm", false);
  ASSERT_TRUE(r);
  auto is_bad = [](const Status& s, const std::string& text) {
    return s.code() == ErrorCode::kInvalidArgument && s.message().find(text) != std::string::npos;
  };
  EXPECT_TRUE(is_bad(r->decode->sender(1).status(), "decode manager"));
  EXPECT_TRUE(is_bad(r->prefill->receiver(1).status(), "prefill manager"));
  auto tx = r->prefill->sender(1).value();
  EXPECT_TRUE(is_bad(r->prefill->sender(1).status(), "already has a sender"));
  EXPECT_TRUE(is_bad(tx->send(std::vector<uint64_t>{0}, {}, true), "before init"));
  EXPECT_TRUE(is_bad(tx->init(0, 0), "at least one page"));
  EXPECT_TRUE(is_bad(tx->init(2, 64), "aux_index 64"));
  EXPECT_TRUE(is_bad(tx->init(2, 0, 100), "100 tokens take 7 pages"));
  ASSERT_TRUE(tx->init(2, 0).ok());
  EXPECT_TRUE(is_bad(tx->init(2, 0), "twice"));
  EXPECT_TRUE(is_bad(tx->send(std::vector<uint64_t>{0, 1, 2}, {}, false), "exceed its 2 pages"));
  EXPECT_TRUE(is_bad(tx->send(std::vector<uint64_t>{0}, {}, true), "leaves 1 of its 2 pages"));
  EXPECT_TRUE(is_bad(tx->send(std::vector<uint64_t>{0, 99}, {}, true), "kv_indices[1] = 99"));
  EXPECT_TRUE(is_bad(tx->send({}, {}, false), "no pages"));
  EXPECT_TRUE(is_bad(tx->send(std::vector<uint64_t>{0}, std::vector<uint64_t>{0}, false), "last chunk only"));

  auto rx = r->decode->receiver(2).value();
  EXPECT_TRUE(is_bad(r->decode->receiver(2).status(), "already has a receiver"));
  EXPECT_TRUE(is_bad(rx->init(1), "prefill_dp_rank 1"));
  EXPECT_TRUE(is_bad(rx->send_metadata(std::vector<uint64_t>{1, 1}, 0, {}), "kv_indices[1] = 1 appears twice"));
  EXPECT_TRUE(is_bad(rx->send_metadata(std::vector<uint64_t>{1, 99}, 0, {}), "kv_indices[1] = 99"));
  EXPECT_TRUE(is_bad(rx->send_metadata(std::vector<uint64_t>{1}, 64, {}), "aux_index 64"));
  EXPECT_TRUE(is_bad(rx->send_metadata({}, 0, {}), "at least one page"));
  EXPECT_EQ(rx->poll(), KVPoll::Bootstrapping) << "a refused call changes nothing";
  EXPECT_EQ(r->decode->stats().live_rooms, 1u);

  ManagerConfig c = base_config(Role::kPrefill, "carrier-pigeon", false);
  EXPECT_TRUE(is_bad(Manager::create(c).status(), "carrier-pigeon"));
  c = base_config(Role::kPrefill, "shm", false);
  c.transfer_shards = 9;
  EXPECT_TRUE(is_bad(Manager::create(c).status(), "transfer_shards 9"));
  c = base_config(Role::kPrefill, "shm", false);
  c.buffers.push_back({});
  EXPECT_EQ(Manager::create(c).status().code(), ErrorCode::kInvalidArgument);
  c = base_config(Role::kDecode, "shm", false);
  auto lone = Manager::create(c);
  ASSERT_TRUE(lone.ok()) << lone.status().str();
  EXPECT_TRUE(is_bad((*lone)->receiver(1).status(), "no prefill bootstrap address"));
}

TEST(Manager, FaultDecoratorOnlyWhenAskedFor) {
  ManagerConfig c = base_config(Role::kPrefill, "shm", false);
  c.fault_injection = false;
  auto plain = Manager::create(c);
  ASSERT_TRUE(plain.ok()) << plain.status().str();
  EXPECT_EQ((*plain)->faults(), nullptr);
  c.fault_injection = true;
  auto faulty = Manager::create(c);
  ASSERT_TRUE(faulty.ok()) << faulty.status().str();
  EXPECT_NE((*faulty)->faults(), nullptr);
  EXPECT_EQ((*faulty)->wait_fds().size(), 2u);
}


// Issue 30 item 4: an engine's poll() of a waiting room sees what already arrived (control frames,
// write completions) without waiting for the progress thread's wake-up. Caller-pumped ranks show
// it: after a first room (pumped: the ranks connect), a second room gets no progress() at all,
// only poll(), and still reaches Success on both sides (without ManagerImpl::progress_inline the
// sender stays Bootstrapping).
TEST(Manager, PollAloneCarriesARoomToSuccess) {
  auto r = make_ranks("shm", false);
  ASSERT_TRUE(r);
  auto no_pump = [] {};
  for (const uint64_t room : {30, 31}) {
    const bool pumped = room == 30;
    const std::vector<uint64_t> src{2, 5}, dst{8, 3};
    auto rx = r->decode->receiver(room).value();
    auto tx = r->prefill->sender(room).value();
    ASSERT_TRUE(rx->init(-1).ok());
    ASSERT_TRUE(rx->send_metadata(dst, 4, {}).ok());
    auto both = [&](KVPoll want) {
      const bool t = tx->poll() == want;  // both polled each round
      return rx->poll() == want && t;
    };
    ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }, 20s, pumped ? std::function<void()>() : no_pump))
        << "room " << room << ": prefill " << to_string(tx->poll()) << ", decode " << to_string(rx->poll());
    ASSERT_TRUE(tx->init(2, 4).ok());
    fill(*r->prefill, room, 0, src);
    ASSERT_TRUE(tx->send(src, {}, true).ok());
    ASSERT_TRUE(r->until([&] { return both(KVPoll::Success); }, 20s, pumped ? std::function<void()>() : no_pump))
        << "room " << room << ": prefill " << to_string(tx->poll()) << ", decode " << to_string(rx->poll());
    EXPECT_EQ(mismatched(*r->decode, room, dst), 0u);
  }
}

}  // namespace
}  // namespace kvferry
