// End-to-end integrity (ManagerConfig::integrity, docs/failure-model.md "Integrity") through the
// public Manager API: prefill and decode managers in one process over shm and tcp, caller-pumped.
// A verified room succeeds (chunked, layer-wise, unequal TP head slices); a byte flipped in flight
// (the fault decorator's corrupt_next_write: the transport reports success) fails the room with
// integrity_error, origin decode, on both ends, logged once above debug; when only one side has it
// on, a decode rank that asks is always answered and a prefill rank that requires it fails rooms
// whose decode rank does not ask; a prefill that leaves the digest out cannot skip the check.
// Every wait is for an event with a deadline, never a window.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "endpoint/endpoint_pair_test_util.h"
#include "kvferry/bootstrap.h"
#include "kvferry/content.h"
#include "kvferry/fault_transport.h"
#include "kvferry/log.h"
#include "kvferry/manager.h"
#include "manager/manager_internal.h"
#include "manager/manager_pair_test_util.h"
#include "manager/manager_tp_test_util.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

using Ranks = testing::TpRanks;

struct Options {
  std::string transport = "shm";
  uint32_t prefill_tp = 1;
  bool prefill_integrity = true;
  bool decode_integrity = true;
  bool log_failures = false;
  int64_t status_retry_ms = 0;  // 0: the default
};

ManagerConfig config(const RankId& self, uint32_t tp, uint32_t peer_tp, const Options& o, const std::string& bootstrap) {
  ManagerConfig c = testing::base_config(self.role, o.transport, false);  // Qwen2.5-7B: 28 layers, 4 KV heads
  c.self = self;
  c.tp_size = tp;
  c.peer_tp_size = peer_tp;
  c.bootstrap_address = bootstrap;
  c.integrity = self.role == Role::kPrefill ? o.prefill_integrity : o.decode_integrity;
  c.deadlines = testing::notice_only();  // only a failure notice or Success ends a room
  if (o.status_retry_ms) c.deadlines.status_retry_ms = o.status_retry_ms;
  if (o.log_failures) c.failure_log_component = self.role == Role::kPrefill ? "prefill.connector" : "decode.connector";
  return c;
}

std::unique_ptr<Ranks> make_ranks(const Options& o) {
  return testing::make_tp_ranks(o.prefill_tp, [&](const RankId& self, uint32_t tp, uint32_t peer_tp,
                                                  const std::string& bootstrap) {
    return config(self, tp, peer_tp, o, bootstrap);
  });
}

using testing::fill;
using testing::mismatched;

// One room from every prefill rank to the decode rank: metadata, then `chunks` page chunks.
struct Room {
  std::unique_ptr<Receiver> rx;
  std::vector<std::unique_ptr<Sender>> tx;
};
Room open_room(Ranks& r, uint64_t room, const std::vector<uint64_t>& src, const std::vector<uint64_t>& dst,
               uint64_t aux) {
  Room o;
  o.rx = r.decode->receiver(room).value();
  EXPECT_TRUE(o.rx->send_metadata(dst, aux, {}).ok());
  for (auto& p : r.prefill) {
    o.tx.push_back(p->sender(room).value());
    EXPECT_TRUE(o.tx.back()->init(src.size(), 0).ok());
    fill(*p, room, 0, src);
  }
  EXPECT_TRUE(r.until([&] {
    for (auto& s : o.tx)
      if (s->poll() != KVPoll::WaitingForInput) return false;
    return true;
  }));
  return o;
}

// Sends the room's pages in two chunks from every prefill rank.
void send_chunked(Room& o, const std::vector<uint64_t>& src) {
  const size_t half = src.size() / 2;
  for (auto& s : o.tx) {
    ASSERT_TRUE(s->send(std::span(src).first(half), {}, false).ok());
    ASSERT_TRUE(s->send(std::span(src).subspan(half), {}, true).ok());
  }
}

bool all_settled(Room& o) {
  if (!o.rx->release_safe()) return false;
  for (auto& s : o.tx)
    if (!s->release_safe()) return false;
  return true;
}

// The failure on every rank: integrity_error, origin the decode rank; local there only.
void expect_integrity_failure(Ranks& r, Room& o, const std::string& reason_part) {
  auto de = o.rx->failure();
  ASSERT_TRUE(de);
  EXPECT_EQ(de->code, ErrorCode::kIntegrityError) << de->str();
  EXPECT_EQ(de->origin, r.decode->self());
  EXPECT_FALSE(de->is_from_another_rank);
  EXPECT_NE(de->failure_reason.find(reason_part), std::string::npos) << de->failure_reason;
  for (auto& s : o.tx) {
    ASSERT_TRUE(r.until([&] { return s->poll() == KVPoll::Failed; })) << to_string(s->poll());
    auto pe = s->failure();
    ASSERT_TRUE(pe);
    EXPECT_EQ(pe->code, ErrorCode::kIntegrityError) << pe->str();
    EXPECT_EQ(pe->origin, r.decode->self());
    EXPECT_TRUE(pe->is_from_another_rank);
  }
}

class ManagerIntegrity : public ::testing::TestWithParam<std::string> {};

// Pages in any order, sent in two chunks: verified on decode and Success on both sides.
TEST_P(ManagerIntegrity, ChunkedRoomIsVerifiedAndSucceeds) {
  auto r = make_ranks({GetParam()});
  ASSERT_TRUE(r);
  const uint64_t room = 0x341;
  const std::vector<uint64_t> src{3, 1, 4, 0, 2, 7}, dst{9, 5, 12, 7, 6, 8};
  Room o = open_room(*r, room, src, dst, 11);
  send_chunked(o, src);
  ASSERT_TRUE(r->until([&] { return o.rx->poll() == KVPoll::Success && o.tx[0]->poll() == KVPoll::Success; }))
      << "prefill " << to_string(o.tx[0]->poll()) << ", decode " << to_string(o.rx->poll())
      << (o.rx->failure() ? ": " + o.rx->failure()->str() : "");
  EXPECT_EQ(mismatched(*r->decode, room, dst), 0u);
}

// Prefill TP 2 -> decode TP 1 (each source writes its head slice of every token row), layer by
// layer: both sources' digests match what landed.
TEST_P(ManagerIntegrity, LayerWiseHeadSlicesFromTwoSourcesAreVerified) {
  auto r = make_ranks({GetParam(), 2});
  ASSERT_TRUE(r);
  const uint64_t room = 0x342;
  const std::vector<uint64_t> src{2, 0, 1}, dst{4, 8, 1};
  Room o = open_room(*r, room, src, dst, 3);
  const uint32_t layers = r->decode->layout().model.num_layers;
  for (uint32_t l = 0; l < layers; ++l)
    for (auto& s : o.tx) ASSERT_TRUE(s->send(src, {l, l + 1}, {}, l + 1 == layers).ok()) << l;
  ASSERT_TRUE(r->until([&] { return o.rx->poll() == KVPoll::Success; }))
      << to_string(o.rx->poll()) << (o.rx->failure() ? ": " + o.rx->failure()->str() : "");
  EXPECT_EQ(mismatched(*r->decode, room, dst), 0u);
  EXPECT_TRUE(r->until([&] { return o.tx[0]->poll() == KVPoll::Success && o.tx[1]->poll() == KVPoll::Success; }));
}

// A byte flipped in flight (the transport reports success): the room fails with
// integrity_error, origin decode, on both ends, and one line above debug names it.
TEST_P(ManagerIntegrity, FlippedByteFailsTheRoomWithIntegrityErrorAtDecode) {
  std::mutex mu;
  std::vector<std::pair<std::string, LogLevel>> lines;
  set_log_callback([&](LogLevel level, std::string_view component, std::string_view, const LogFields& f) {
    std::lock_guard lock(mu);
    if (f.room == 0x343u && level > LogLevel::kDebug) lines.push_back({std::string(component), level});
  });
  Options opt{GetParam()};
  opt.log_failures = true;
  auto r = make_ranks(opt);
  ASSERT_TRUE(r);
  const uint64_t room = 0x343;
  const std::vector<uint64_t> src{0, 1, 2, 3}, dst{4, 5, 6, 7};
  Room o = open_room(*r, room, src, dst, 2);
  Manager& pre = *r->prefill[0];
  pre.faults()->corrupt_next_write(room);
  send_chunked(o, src);
  ASSERT_TRUE(r->until([&] { return o.rx->poll() == KVPoll::Failed; }))
      << "decode " << to_string(o.rx->poll()) << ": the flipped byte was not caught";
  EXPECT_EQ(pre.faults()->corrupted_writes(), 1u);
  EXPECT_EQ(pre.stats().transport.failed_batches, 0u) << "the transport reported nothing";
  EXPECT_EQ(mismatched(*r->decode, room, dst), 1u) << "exactly the one flipped byte landed wrong";
  expect_integrity_failure(*r, o, "do not match its digest");
  ASSERT_TRUE(r->until([&] { return all_settled(o); }));
  EXPECT_FALSE(o.rx->quarantined());
  fill(pre, room, 0, src);  // the source kept its bytes (the flip was undone on completion)
  o.tx.clear();
  o.rx.reset();
  ASSERT_TRUE(r->until([&] { return pre.stats().live_rooms == 0 && r->decode->stats().live_rooms == 0; }));
  set_log_callback({});
  std::lock_guard lock(mu);
  ASSERT_EQ(lines.size(), 1u) << "one line above debug for one root cause";
  EXPECT_EQ(lines[0].first, "decode.connector");
  EXPECT_EQ(lines[0].second, LogLevel::kError);
}

// The guard row is covered too: a byte flipped in the final batch (a last send of no pages sends
// it alone) is named integrity_error, not a guard mismatch.
TEST_P(ManagerIntegrity, FlippedByteInTheFinalBatchIsAnIntegrityError) {
  auto r = make_ranks({GetParam()});
  ASSERT_TRUE(r);
  const uint64_t room = 0x344;
  const std::vector<uint64_t> src{0, 1}, dst{2, 3};
  Room o = open_room(*r, room, src, dst, 5);
  r->prefill[0]->faults()->corrupt_next_write(room, 1);  // the KV chunk goes by, the final batch not
  ASSERT_TRUE(o.tx[0]->send(src, {}, false).ok());
  ASSERT_TRUE(o.tx[0]->send({}, {}, true).ok());
  ASSERT_TRUE(r->until([&] { return o.rx->poll() == KVPoll::Failed; })) << to_string(o.rx->poll());
  EXPECT_EQ(r->prefill[0]->faults()->corrupted_writes(), 1u);
  EXPECT_EQ(mismatched(*r->decode, room, dst), 0u) << "the KV pages landed intact";
  expect_integrity_failure(*r, o, "do not match its digest");
}

// Unequal TP: a byte flipped in the second source's slice names that source.
TEST_P(ManagerIntegrity, FlippedByteFromTheSecondSourceNamesIt) {
  auto r = make_ranks({GetParam(), 2});
  ASSERT_TRUE(r);
  const uint64_t room = 0x345;
  const std::vector<uint64_t> src{1, 0}, dst{6, 2};
  Room o = open_room(*r, room, src, dst, 4);
  r->prefill[1]->faults()->corrupt_next_write(room);
  send_chunked(o, src);
  ASSERT_TRUE(r->until([&] { return o.rx->poll() == KVPoll::Failed; })) << to_string(o.rx->poll());
  expect_integrity_failure(*r, o, "the bytes prefill/tp1 wrote");
}

INSTANTIATE_TEST_SUITE_P(Transports, ManagerIntegrity, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

// Without integrity the same flipped byte goes unnoticed by kvferry (Success): the check is what
// catches it above.
TEST(ManagerIntegrityOff, AFlippedByteIsNotCaughtWithoutIt) {
  auto r = make_ranks({"shm", 1, false, false});
  ASSERT_TRUE(r);
  const uint64_t room = 0x346;
  const std::vector<uint64_t> src{0, 1}, dst{0, 1};
  Room o = open_room(*r, room, src, dst, 1);
  r->prefill[0]->faults()->corrupt_next_write(room);
  send_chunked(o, src);
  ASSERT_TRUE(r->until([&] { return o.rx->poll() == KVPoll::Success; })) << to_string(o.rx->poll());
  EXPECT_EQ(mismatched(*r->decode, room, dst), 1u);
}

// Only decode has it on: the prefill rank answers the request with its digest, and the room is
// verified (a decode rank that asks is never left unverified by the peer's setting).
TEST(ManagerIntegrityOneSide, DecodeAsksAndPrefillWithItOffStillSendsTheDigest) {
  auto r = make_ranks({"shm", 1, false, true});
  ASSERT_TRUE(r);
  const std::vector<uint64_t> src{0, 1, 2}, dst{5, 3, 4};
  Room o = open_room(*r, 0x347, src, dst, 2);
  send_chunked(o, src);
  ASSERT_TRUE(r->until([&] { return o.rx->poll() == KVPoll::Success; }))
      << to_string(o.rx->poll()) << (o.rx->failure() ? ": " + o.rx->failure()->str() : "");
  // ... and it is checked: the same set-up catches a flipped byte.
  Room bad = open_room(*r, 0x348, src, {8, 9, 10}, 3);
  r->prefill[0]->faults()->corrupt_next_write(0x348);
  send_chunked(bad, src);
  ASSERT_TRUE(r->until([&] { return bad.rx->poll() == KVPoll::Failed; }));
  expect_integrity_failure(*r, bad, "do not match its digest");
}

// Only prefill has it on: the room fails before any byte is written (integrity_error, origin the
// prefill rank, which names the mismatch), on both sides.
TEST(ManagerIntegrityOneSide, PrefillRequiresItAndDecodeDoesNotAsk) {
  auto r = make_ranks({"shm", 1, true, false});
  ASSERT_TRUE(r);
  const uint64_t room = 0x349;
  auto rx = r->decode->receiver(room).value();
  auto tx = r->prefill[0]->sender(room).value();
  ASSERT_TRUE(rx->send_metadata(std::vector<uint64_t>{0, 1}, 0, {}).ok());
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::WaitingForInput; }));
  ASSERT_TRUE(tx->init(2, 0).ok());  // the metadata is checked as the room opens
  ASSERT_TRUE(r->until([&] { return tx->poll() == KVPoll::Failed && rx->poll() == KVPoll::Failed; }))
      << "prefill " << to_string(tx->poll()) << ", decode " << to_string(rx->poll());
  auto pe = tx->failure(), de = rx->failure();
  ASSERT_TRUE(pe && de);
  EXPECT_EQ(pe->code, ErrorCode::kIntegrityError);
  EXPECT_EQ(pe->origin, r->prefill[0]->self());
  EXPECT_FALSE(pe->is_from_another_rank);
  EXPECT_NE(pe->failure_reason.find("did not ask for the room's integrity digest"), std::string::npos)
      << pe->failure_reason;
  EXPECT_EQ(de->code, ErrorCode::kIntegrityError);
  EXPECT_EQ(de->origin, r->prefill[0]->self());
  EXPECT_TRUE(de->is_from_another_rank);
  EXPECT_EQ(r->prefill[0]->stats().transport.bytes_written, 0u);
}

// A prefill rank that says Success without the digest decode asked for (an earlier build, or a
// liar: KVFERRY_TEST_OMIT_DIGEST=1) cannot skip the check: the room fails at decode.
TEST(ManagerIntegrityOneSide, SuccessWithoutTheAskedDigestFailsTheRoom) {
  ::setenv("KVFERRY_TEST_OMIT_DIGEST", "1", 1);  // read when the prefill endpoint is built
  auto r = make_ranks({"shm", 1, true, true});
  ::unsetenv("KVFERRY_TEST_OMIT_DIGEST");
  ASSERT_TRUE(r);
  const std::vector<uint64_t> src{0, 1}, dst{2, 3};
  Room o = open_room(*r, 0x34a, src, dst, 1);
  send_chunked(o, src);
  ASSERT_TRUE(r->until([&] { return o.rx->poll() == KVPoll::Failed; })) << to_string(o.rx->poll());
  EXPECT_EQ(mismatched(*r->decode, 0x34a, dst), 0u) << "the bytes are right; the digest is missing";
  expect_integrity_failure(*r, o, "without the integrity digest this room asked for");
}

// A decode rank that lost prefill's Success asks again (decode_reask.cc): the Success sent again,
// before and after prefill released the room, carries the same digest, or decode would fail a room
// whose bytes are right.
TEST(ManagerIntegrityLostStatus, SuccessSentAgainCarriesTheDigestBeforeAndAfterRelease) {
  auto r = make_ranks({"shm"});
  ASSERT_TRUE(r);
  auto& pre = static_cast<ManagerImpl&>(*r->prefill[0]);
  auto& dec = static_cast<ManagerImpl&>(*r->decode);
  const uint64_t room = 0x34b;
  std::vector<std::optional<uint64_t>> successes;  // decode's view of each Success frame
  dec.set_message_hook([&](const Message& m) {
    if (auto* st = std::get_if<RoomStatus>(&m); st && st->room == room && st->state == KVPoll::Success)
      successes.push_back(st->digest);
  });
  const std::vector<uint64_t> src{0, 1, 2}, dst{3, 4, 5};
  Room o = open_room(*r, room, src, dst, 6);
  send_chunked(o, src);
  ASSERT_TRUE(r->until([&] { return o.rx->poll() == KVPoll::Success && o.tx[0]->poll() == KVPoll::Success; }));
  ASSERT_EQ(successes.size(), 1u);
  ASSERT_TRUE(successes[0].has_value());
  // The metadata again, as decode's ask sends it.
  RoomMetadata md{room, dec.self(), dst, 6, {}, 1};
  md.integrity = true;
  md.incarnation = dec.core().incarnation();
  md.peer_incarnation = pre.core().incarnation();
  pre.prefill()->on_message(Message(md));
  ASSERT_TRUE(r->until([&] { return successes.size() == 2; }));
  EXPECT_EQ(successes[1], successes[0]);
  o.tx.clear();  // released: the answer comes from the room's tombstone
  ASSERT_TRUE(r->until([&] { return pre.stats().live_rooms == 0; }));
  pre.prefill()->on_message(Message(md));
  ASSERT_TRUE(r->until([&] { return successes.size() == 3; }));
  EXPECT_EQ(successes[2], successes[0]);
  dec.set_message_hook({});
}

// Decode's ask (its metadata sent again while no status came) asks for the digest as the first
// did: it may be the one that arrives.
TEST(ManagerIntegrityLostStatus, AskedAgainMetadataAsksForTheDigest) {
  Options opt{"shm"};
  opt.status_retry_ms = 20;
  auto r = make_ranks(opt);
  ASSERT_TRUE(r);
  auto& pre = static_cast<ManagerImpl&>(*r->prefill[0]);
  const uint64_t room = 0x34c;
  std::vector<bool> asked;  // prefill's view of each metadata frame of the room
  pre.set_message_hook([&](const Message& m) {
    if (auto* md = std::get_if<RoomMetadata>(&m); md && md->room == room) asked.push_back(md->integrity);
  });
  auto rx = r->decode->receiver(room).value();
  ASSERT_TRUE(rx->send_metadata(std::vector<uint64_t>{1, 2}, 0, {}).ok());
  // Only decode runs until it asked again (its ask counter is in its debug log; the frames wait
  // in prefill's socket).
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (r->decode->stats().live_rooms == 1 && std::chrono::steady_clock::now() < end) {
    r->decode->progress();
    std::vector<int> fds = r->decode->wait_fds();
    wait_readable(fds.data(), static_cast<int>(fds.size()), 5);
    if (static_cast<ManagerImpl&>(*r->decode).decode()->room(room)->asks >= 2) break;
  }
  ASSERT_GE(static_cast<ManagerImpl&>(*r->decode).decode()->room(room)->asks, 2u);
  ASSERT_TRUE(r->until([&] { return asked.size() >= 3; }));
  for (bool a : asked) EXPECT_TRUE(a);
  pre.set_message_hook({});
}

// Integrity reads the bytes on the host: device buffers are refused at creation.
TEST(ManagerIntegrityConfig, DeviceBuffersAreRefused) {
  ManagerConfig c = testing::base_config(Role::kDecode, "shm", false);
  c.integrity = true;
  BufferDesc b;
  b.memory = MemoryKind::kCuda;
  b.address = 0x10000;
  b.item_bytes = 4096;
  b.bytes = 4 * 4096;
  c.buffers.push_back(b);
  auto m = Manager::create(c);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("integrity needs host memory"), std::string::npos) << m.status().str();
}

}  // namespace
}  // namespace kvferry
