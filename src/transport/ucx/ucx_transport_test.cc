// Two UCX transports (two workers) in one process, connected A -> B, for shm and tcp.
#include "transport/ucx/ucx_transport.h"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "transport/ucx/transport_test_util.h"

namespace kvferry::ucx {
namespace {

using namespace std::chrono_literals;
using testing::Completion;
using testing::expected_image;
using testing::write_and_wait;

constexpr uint64_t kRegion = 16ull << 20;
constexpr uint8_t kFill = 0xEE;

struct Pair {
  std::unique_ptr<UcxTransport> a, b;
  LocalRegion ra, rb;
  PeerId peer = 0;  // A's id for B
};

Pair make_pair(TransportKind kind, UcxTestHooks hooks_a = {}, UcxTestHooks hooks_b = {}) {
  Pair p;
  TransportOptions opt;
  opt.kind = kind;
  auto a = UcxTransport::create(opt, hooks_a);
  auto b = UcxTransport::create(opt, hooks_b);
  EXPECT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!a.ok() || !b.ok()) return p;
  p.a = std::move(a).value();
  p.b = std::move(b).value();
  testing::wire_pair(p, kRegion, kFill);
  return p;
}

bool region_equals(const LocalRegion& r, const std::vector<uint8_t>& img) {
  return img.size() == r.bytes && std::memcmp(r.base, img.data(), img.size()) == 0;
}

class UcxPairTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(UcxPairTest, CoalescedRunsLandExactlyAtTheirOffsets) {
  Pair p = make_pair(GetParam());
  ASSERT_NE(p.peer, 0u);
  EXPECT_EQ(p.a->mode(),
            GetParam() == TransportKind::kShm ? WriteMode::kPut : WriteMode::kActiveMessage);
  std::vector<WriteOp> ops = {
      {0, 100, 1},                                  // a single byte
      {4096, 8192, 64 << 10},                       // one 64 KiB run
      {(1 << 20) + 3, (3 << 20) + 1, (1 << 20)},    // unaligned 1 MiB
      {5 << 20, kRegion - (8 << 20), 8 << 20},      // 8 MiB, ends at the region's end
      {77, 300, 0},                                 // empty op: ignored
      {200, 80000, 4099},                           // odd size just after the 64 KiB run
  };
  ASSERT_TRUE(write_and_wait(*p.a, p.peer, 42, ops).ok());
  EXPECT_TRUE(region_equals(p.rb, expected_image(kRegion, kFill, ops)));
  TransportStats s = p.a->stats();
  EXPECT_EQ(s.bytes_written, 1u + (64 << 10) + (1 << 20) + (8 << 20) + 4099);
  // shm: one put per non-empty op; tcp: the two ops under kScatterMaxOpBytes share one scatter AM.
  EXPECT_EQ(s.writes, GetParam() == TransportKind::kShm ? 5u : 4u);
  EXPECT_EQ(s.batches, 1u);
  EXPECT_EQ(s.failed_batches, 0u);
  EXPECT_EQ(s.peers, 1u);
}

// Caller-owned memory (as the Python module registers numpy arrays), unaligned base on both sides.
TEST_P(UcxPairTest, RegisteredCallerMemoryReceivesWritesAtItsOffsets) {
  TransportOptions opt;
  opt.kind = GetParam();
  auto a = UcxTransport::create(opt);
  auto b = UcxTransport::create(opt);
  ASSERT_TRUE(a.ok() && b.ok());
  constexpr uint64_t kBytes = 1 << 20;
  std::vector<uint8_t> src(kBytes + 3), dst(kBytes + 5, kFill);
  auto sa = a.value()->register_spans({{src.data() + 3, kBytes, 0}});
  auto sb = b.value()->register_spans({{dst.data() + 5, kBytes, 0}});
  ASSERT_TRUE(sa.ok() && sb.ok()) << sa.status().str() << " " << sb.status().str();
  ASSERT_EQ(sa->size(), 1u);
  ASSERT_EQ(sb->size(), 1u);
  const LocalRegion* ra = &sa->front();
  const LocalRegion* rb = &sb->front();
  EXPECT_EQ(ra->base, src.data() + 3);
  EXPECT_EQ(rb->base, dst.data() + 5);
  EXPECT_EQ(b.value()->create_region(4096).status().code(), ErrorCode::kInvalidArgument);  // once only
  testing::fill_pattern(ra->base, kBytes);
  auto id = a.value()->connect(testing::remote_info(*b.value(), *rb));
  ASSERT_TRUE(id.ok()) << id.status().str();
  std::vector<WriteOp> ops = {{0, 10, 4096}, {70000, 200000, 300000}, {kBytes - 8, kBytes - 8, 8}};
  ASSERT_TRUE(write_and_wait(*a.value(), *id, 3, ops).ok());
  std::vector<uint8_t> img = expected_image(kBytes, kFill, ops);
  EXPECT_EQ(std::memcmp(dst.data() + 5, img.data(), kBytes), 0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dst[i], kFill);  // nothing before the registered base
  EXPECT_EQ(write_and_wait(*a.value(), *id, 3, {{0, kBytes - 4, 8}}).code(), ErrorCode::kProtocolError);
  b.value().reset();  // the transport is gone before the memory it registered
  a.value().reset();
}

TEST_P(UcxPairTest, ManyConcurrentBatchesEachCompleteOnce) {
  Pair p = make_pair(GetParam());
  ASSERT_NE(p.peer, 0u);
  constexpr int kBatches = 64;
  std::vector<Completion> done(kBatches);
  std::vector<WriteOp> all;
  auto submit = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      uint64_t off = static_cast<uint64_t>(i) * (128 << 10);
      p.a->write(p.peer, 1000 + i, {{off, off + 7, 100000}}, done[i].callback());
    }
  };
  std::thread t1(submit, 0, kBatches / 2), t2(submit, kBatches / 2, kBatches);
  t1.join();
  t2.join();
  for (int i = 0; i < kBatches; ++i) {
    uint64_t off = static_cast<uint64_t>(i) * (128 << 10);
    all.push_back({off, off + 7, 100000});
    EXPECT_TRUE(done[i].wait().ok()) << i;
  }
  std::this_thread::sleep_for(20ms);
  for (auto& d : done) EXPECT_EQ(d.calls->load(), 1);
  EXPECT_TRUE(region_equals(p.rb, expected_image(kRegion, kFill, all)));
  EXPECT_EQ(p.a->stats().batches, static_cast<uint64_t>(kBatches));
}

TEST_P(UcxPairTest, OutOfBoundsOpsAreRejectedAndNothingIsSent) {
  Pair p = make_pair(GetParam());
  ASSERT_NE(p.peer, 0u);
  std::vector<std::vector<WriteOp>> bad = {
      {{0, 0, 16}, {0, kRegion - 8, 16}},  // remote end past the region (first op fine)
      {{kRegion - 8, 0, 16}},              // local end past the region
      {{0, ~0ull - 3, 8}},                 // offset + length overflows
      {{0, kRegion + 1, 0}},               // empty but starts past the end
  };
  for (auto& ops : bad) {
    Status st = write_and_wait(*p.a, p.peer, 7, ops);
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.message();
    EXPECT_NE(st.message().find("peer 1"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("room 7"), std::string::npos) << st.message();
  }
  std::vector<uint8_t> untouched(kRegion, kFill);
  EXPECT_TRUE(region_equals(p.rb, untouched));
  EXPECT_EQ(p.a->stats().writes, 0u);
  EXPECT_EQ(p.a->stats().failed_batches, bad.size());
}

TEST_P(UcxPairTest, UnknownPeerAndEmptyBatch) {
  Pair p = make_pair(GetParam());
  ASSERT_NE(p.peer, 0u);
  EXPECT_EQ(write_and_wait(*p.a, 999, 1, {{0, 0, 8}}).code(), ErrorCode::kPeerUnreachable);
  EXPECT_TRUE(write_and_wait(*p.a, p.peer, 1, {}).ok());
  EXPECT_EQ(p.a->create_region(4096).status().code(), ErrorCode::kInvalidArgument);
}

TEST_P(UcxPairTest, DisconnectFailsTheWriteInFlight) {
  UcxTestHooks no_acks;
  no_acks.suppress_acks = true;  // tcp: B never acknowledges, so the write stays in flight
  Pair p = make_pair(GetParam(), {}, no_acks);
  ASSERT_NE(p.peer, 0u);
  Completion c;
  p.a->write(p.peer, 5, {{0, 0, 1 << 20}}, c.callback());
  p.a->disconnect(p.peer);
  Status st = c.wait();
  if (GetParam() == TransportKind::kTcp) {
    EXPECT_EQ(st.code(), ErrorCode::kTransferError) << st.message();
    EXPECT_NE(st.message().find("disconnected"), std::string::npos) << st.message();
  } else {
    EXPECT_TRUE(st.ok()) << st.message();  // a shm put + flush completes before disconnect runs
  }
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(c.calls->load(), 1);
  EXPECT_EQ(write_and_wait(*p.a, p.peer, 6, {{0, 0, 8}}).code(), ErrorCode::kPeerUnreachable);
  EXPECT_EQ(p.a->stats().peers, 0u);
}

TEST_P(UcxPairTest, DestructorCompletesOutstandingBatchesWithAnError) {
  UcxTestHooks no_acks;
  no_acks.suppress_acks = true;
  Pair p = make_pair(GetParam(), {}, no_acks);
  ASSERT_NE(p.peer, 0u);
  Completion c;
  p.a->write(p.peer, 5, {{0, 0, 4096}}, c.callback());
  p.a.reset();
  ASSERT_EQ(c.future.wait_for(0s), std::future_status::ready);
  Status st = c.future.get();
  if (GetParam() == TransportKind::kTcp) {
    EXPECT_EQ(st.code(), ErrorCode::kTransferError) << st.message();
  }
  EXPECT_EQ(c.calls->load(), 1);
}

// Resident memory (docs/transport.md): registered spans are locked and pre-faulted, and over shm so
// is the writer's mapping of the peer's span, so a transfer pays no page fault. The control run,
// with both turned off, shows the counting sees the faults a transfer pays otherwise.
uint64_t page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_minflt) + static_cast<uint64_t>(u.ru_majflt);
}

uint64_t faults_of_a_whole_region_write(TransportKind kind) {
  Pair p = make_pair(kind);
  EXPECT_NE(p.peer, 0u);
  if (p.peer == 0) return 0;
  const uint64_t before = page_faults();
  EXPECT_TRUE(write_and_wait(*p.a, p.peer, 7, {{0, 0, kRegion}}).ok());
  return page_faults() - before;
}

TEST_P(UcxPairTest, RegisteredMemoryIsLockedAndTransfersPayNoPageFaults) {
  Pair p = make_pair(GetParam());
  ASSERT_NE(p.peer, 0u);
  const TransportStats s = p.b->stats();
  EXPECT_EQ(s.locked_bytes + s.unlocked_bytes, kRegion);
  if (geteuid() == 0) {
    EXPECT_EQ(s.locked_bytes, kRegion);  // root has CAP_IPC_LOCK
    EXPECT_EQ(s.residency_warnings, 0u);
  }
  if (GetParam() != TransportKind::kShm) return;  // over tcp the receiver's own pages are written
  // Under AddressSanitizer the copy also faults in the shadow of the destination (1 byte per 8):
  // those are the sanitizer's, not the region's.
#if defined(__SANITIZE_ADDRESS__)
  constexpr uint64_t kShadowFaults = kRegion / 8 / 4096 + 64;
#else
  constexpr uint64_t kShadowFaults = 0;
#endif
  EXPECT_LT(faults_of_a_whole_region_write(GetParam()), 64u + kShadowFaults);
  ::setenv("KVFERRY_POOL_LOCK", "0", 1);
  ::setenv("KVFERRY_POOL_PREFAULT", "0", 1);
  const uint64_t control = faults_of_a_whole_region_write(GetParam());
  ::unsetenv("KVFERRY_POOL_LOCK");
  ::unsetenv("KVFERRY_POOL_PREFAULT");
  EXPECT_GE(control, kRegion / 4096 / 2 + kShadowFaults) << "the control run should fault";
}

INSTANTIATE_TEST_SUITE_P(Kinds, UcxPairTest,
                         ::testing::Values(TransportKind::kShm, TransportKind::kTcp),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

// UCX's own choice, and both receiver paths: eager (data in the callback) and rendezvous
// (ucp_am_recv_data_nbx).
constexpr uint32_t kAmProtocols[] = {0, UCP_AM_SEND_FLAG_EAGER, UCP_AM_SEND_FLAG_RNDV};

TEST(UcxTcpTest, EagerAndRendezvousBothPlaceData) {
  for (uint32_t flags : kAmProtocols) {
    UcxTestHooks hooks;
    hooks.am_send_flags = flags;
    Pair p = make_pair(TransportKind::kTcp, hooks);
    ASSERT_NE(p.peer, 0u);
    std::vector<WriteOp> ops = {{10, 20, 1000}, {1 << 20, 5 << 20, 3 << 20}};
    ASSERT_TRUE(write_and_wait(*p.a, p.peer, 1, ops).ok()) << flags;
    EXPECT_TRUE(region_equals(p.rb, expected_image(kRegion, kFill, ops))) << flags;
  }
}

TEST(UcxTcpTest, ReceiverRejectsAForgedOutOfRangeHeader) {
  for (uint32_t flags : kAmProtocols) {
    UcxTestHooks forge;
    forge.skip_local_bounds_check = true;  // A sends what a malicious peer would
    forge.am_send_flags = flags;
    Pair p = make_pair(TransportKind::kTcp, forge);
    ASSERT_NE(p.peer, 0u);
    Status st = write_and_wait(*p.a, p.peer, 9, {{0, kRegion - 10, 100}});
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.message();
    EXPECT_NE(st.message().find("refused"), std::string::npos) << st.message();
    st = write_and_wait(*p.a, p.peer, 9, {{0, kRegion + (1 << 20), 2 << 20}});
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.message();
    st = write_and_wait(*p.a, p.peer, 9, {{0, ~0ull - 50, 100}});  // wraps around
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.message();
    EXPECT_EQ(p.b->rejected_incoming(), 3u);
    std::vector<uint8_t> untouched(kRegion, kFill);
    EXPECT_TRUE(region_equals(p.rb, untouched));
    // The connection stays usable for valid writes.
    EXPECT_TRUE(write_and_wait(*p.a, p.peer, 10, {{0, 0, 4096}}).ok());
  }
}

// Head-sliced transfers: thousands of small strided writes travel packed in a few scatter
// messages (one ack each), not one message per write.
TEST(UcxTcpTest, SmallWritesArePackedIntoScatterMessages) {
  for (uint32_t flags : kAmProtocols) {
    UcxTestHooks hooks;
    hooks.am_send_flags = flags;
    Pair p = make_pair(TransportKind::kTcp, hooks);
    ASSERT_NE(p.peer, 0u);
    std::vector<WriteOp> ops;
    for (uint64_t i = 0; i < 3000; ++i) ops.push_back({i * 1024 + 3, i * 2048 + 100, 512});
    ops.push_back({8 << 20, 12 << 20, 1 << 20});  // a large op in the same batch: its own message
    ops.push_back({9 << 20, 14 << 20, 0});         // empty ops are skipped
    ASSERT_TRUE(write_and_wait(*p.a, p.peer, 1, ops).ok()) << flags;
    EXPECT_TRUE(region_equals(p.rb, expected_image(kRegion, kFill, ops))) << flags;
    // 3000 x 512 B: 3 scatter messages of <= 512 KiB (1024 entries), plus the large op.
    EXPECT_EQ(p.a->stats().writes, 4u) << flags;
    EXPECT_EQ(p.a->stats().bytes_written, 3000u * 512 + (1 << 20)) << flags;
    EXPECT_EQ(p.b->rejected_incoming(), 0u);
  }
}

// A head slice into a narrower row (prefill TP < decode TP): the remote pieces follow each other,
// so they travel as one remote range gathered from the strided local pieces.
TEST(UcxTcpTest, RemoteContiguousPiecesAreGatheredIntoOneWrite) {
  for (uint32_t flags : kAmProtocols) {
    UcxTestHooks hooks;
    hooks.am_send_flags = flags;
    Pair p = make_pair(TransportKind::kTcp, hooks);
    ASSERT_NE(p.peer, 0u);
    std::vector<WriteOp> ops;
    for (uint64_t i = 0; i < 3000; ++i) ops.push_back({i * 1024 + 3, 100 + i * 512, 512});
    for (uint64_t i = 0; i < 50; ++i) ops.push_back({(4 << 20) + i * 1024, (8 << 20) + i * 256, 256});
    ASSERT_TRUE(write_and_wait(*p.a, p.peer, 1, ops).ok()) << flags;
    EXPECT_TRUE(region_equals(p.rb, expected_image(kRegion, kFill, ops))) << flags;
    // 1.5 MB gathered into one write; the 50 x 256 B run (12.5 KiB) is one scatter entry.
    EXPECT_EQ(p.a->stats().writes, 2u) << flags;
    EXPECT_EQ(p.a->stats().bytes_written, 3000u * 512 + 50 * 256) << flags;
  }
}

TEST(UcxTcpTest, ReceiverRejectsAScatterMessageWithAnOutOfRangeEntry) {
  for (uint32_t flags : kAmProtocols) {
    UcxTestHooks forge;
    forge.skip_local_bounds_check = true;  // A sends what a malicious peer would
    forge.am_send_flags = flags;
    Pair p = make_pair(TransportKind::kTcp, forge);
    ASSERT_NE(p.peer, 0u);
    std::vector<WriteOp> ops;
    for (uint64_t i = 0; i < 100; ++i) ops.push_back({i * 512, i * 512, 512});
    ops[60].remote_offset = kRegion - 100;  // runs 412 bytes past the end of B's region
    Status st = write_and_wait(*p.a, p.peer, 9, ops);
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.message();
    ops[60].remote_offset = ~0ull - 50;  // wraps around
    st = write_and_wait(*p.a, p.peer, 9, ops);
    EXPECT_EQ(st.code(), ErrorCode::kProtocolError) << st.message();
    EXPECT_EQ(p.b->rejected_incoming(), 2u);
    // Not even the valid entries before the bad one were written.
    EXPECT_TRUE(region_equals(p.rb, std::vector<uint8_t>(kRegion, kFill)));
    ops[60].remote_offset = 60 * 512;
    st = write_and_wait(*p.a, p.peer, 10, ops);
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_TRUE(region_equals(p.rb, expected_image(kRegion, kFill, ops)));
  }
}

TEST(UcxTcpTest, PeerDestructionFailsInFlightWritesAndCallsTheErrorHandler) {
  UcxTestHooks no_acks;
  no_acks.suppress_acks = true;
  Pair p = make_pair(TransportKind::kTcp, {}, no_acks);
  ASSERT_NE(p.peer, 0u);
  auto failed = std::make_shared<std::promise<std::pair<PeerId, Status>>>();
  auto failed_f = failed->get_future();
  p.a->set_peer_error_handler([failed, once = std::make_shared<std::once_flag>()](
                                  PeerId id, Status st) {
    std::call_once(*once, [&] { failed->set_value({id, st}); });
  });
  Completion c;
  p.a->write(p.peer, 11, {{0, 0, 1 << 20}}, c.callback());
  std::this_thread::sleep_for(50ms);  // let the data reach B (which never acks)
  p.b.reset();
  Status st = c.wait(5s);
  EXPECT_EQ(st.code(), ErrorCode::kPeerUnreachable) << st.message();
  EXPECT_NE(st.message().find("tcp peer 1, room 11"), std::string::npos) << st.message();
  ASSERT_EQ(failed_f.wait_for(5s), std::future_status::ready);
  auto [id, why] = failed_f.get();
  EXPECT_EQ(id, p.peer);
  EXPECT_EQ(why.code(), ErrorCode::kPeerUnreachable);
  EXPECT_EQ(write_and_wait(*p.a, p.peer, 12, {{0, 0, 8}}).code(), ErrorCode::kPeerUnreachable);
  EXPECT_EQ(p.a->stats().peers, 0u);
}

uint64_t rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// A region is resident once created (docs/transport.md "Resident memory"): its pages are faulted
// in before create_region returns (and locked where the privilege allows), so no transfer pays a
// first-touch fault. (Before issue 15 the opposite was asserted: pages were touched only when written.)
TEST(UcxShmTest, RegionIsResidentOnceCreated) {
  TransportOptions opt;
  auto t = UcxTransport::create(opt);
  ASSERT_TRUE(t.ok());
  constexpr uint64_t kBytes = 256ull << 20;
  uint64_t before = rss_kib();
  auto r = t.value()->create_region(kBytes);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->bytes, kBytes);
  EXPECT_GE(rss_kib(), before + kBytes / 1024 - 1024);  // every page resident
  const TransportStats s = t.value()->stats();
  EXPECT_EQ(s.locked_bytes + s.unlocked_bytes, kBytes);
}

// Issue 33c: the shm transport sets UCX's shared-memory fragment size itself (ucx_config.h
// kShmSegSize), so the environment's does not reach it. With 65536 in the environment UCX 1.13
// lost the bytes of puts into caller-owned memory (the 16-bit fragment length wrapped) and still
// reported Success; here every byte must land.
TEST(UcxShmSegSize, TheEnvironmentsSegmentSizeDoesNotReachTheShmTransport) {
  struct ScopedEnv {
    const char* name;
    std::optional<std::string> was;
    ScopedEnv(const char* n, const char* v) : name(n) {
      if (const char* old = std::getenv(n)) was = old;
      setenv(n, v, 1);
    }
    ~ScopedEnv() { was ? setenv(name, was->c_str(), 1) : unsetenv(name); }
  };
  ScopedEnv sysv("UCX_SYSV_SEG_SIZE", "65536"), posix("UCX_POSIX_SEG_SIZE", "65536");
  TransportOptions opt;
  opt.kind = TransportKind::kShm;
  auto a = UcxTransport::create(opt);
  auto b = UcxTransport::create(opt);
  ASSERT_TRUE(a.ok() && b.ok());
  constexpr uint64_t kBytes = 4 << 20;  // 128 fragments of 32 KiB, 64 of 64 KiB
  auto ra = a.value()->create_region(kBytes);
  std::vector<uint8_t> dst(kBytes, kFill);  // caller-owned: UCX carries puts into it as fragments
  auto sb = b.value()->register_spans({{dst.data(), kBytes, 0}});
  ASSERT_TRUE(ra.ok() && sb.ok()) << ra.status().str() << " " << sb.status().str();
  testing::fill_pattern(ra->base, kBytes);
  auto id = a.value()->connect(testing::remote_info(*b.value(), sb->front()));
  ASSERT_TRUE(id.ok()) << id.status().str();
  std::vector<WriteOp> ops = {{0, 0, kBytes}};
  ASSERT_TRUE(write_and_wait(*a.value(), *id, 1, ops).ok());
  std::vector<uint8_t> img = expected_image(kBytes, kFill, ops);
  size_t wrong = 0;
  for (uint64_t k = 0; k < kBytes; ++k) wrong += dst[k] != img[k];
  EXPECT_EQ(wrong, 0u) << "of " << kBytes << " bytes";
  b.value().reset();  // the transport is gone before the memory it registered
  a.value().reset();
}

}  // namespace
}  // namespace kvferry::ucx
