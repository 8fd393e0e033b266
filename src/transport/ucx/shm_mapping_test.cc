// Where a peer's shared-memory span lies in this process (shm_mapping.h): the check itself over
// real mappings (a memfd shorter than its mapping, private and read-only memory, taken ranges),
// and a shm transport that refuses a peer whose announced span is larger than, or outside, the
// segment its rkey maps, while an honest one connects and is written.
#include "transport/ucx/shm_mapping.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "transport/ucx/transport_test_util.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {
namespace {

constexpr size_t kPage = 4096;

// A shared mapping of `map_bytes` over a memfd of `file_bytes`.
struct SharedFile {
  int fd = -1;
  uint8_t* base = nullptr;
  size_t map_bytes = 0;
  SharedFile(size_t file_bytes, size_t map_bytes_, int prot = PROT_READ | PROT_WRITE) : map_bytes(map_bytes_) {
    fd = memfd_create("kvferry-shm-mapping-test", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(file_bytes)) != 0) return;
    void* p = mmap(nullptr, map_bytes, prot, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) base = static_cast<uint8_t*>(p);
  }
  ~SharedFile() {
    if (base) munmap(base, map_bytes);
    if (fd >= 0) close(fd);
  }
};

TEST(ShmMapping, ASpanInsideOneBackedSharedMappingPasses) {
  SharedFile f(4 * kPage, 4 * kPage);
  ASSERT_NE(f.base, nullptr);
  EXPECT_TRUE(check_peer_mapping(f.base, 4 * kPage, {}).ok());
  EXPECT_TRUE(check_peer_mapping(f.base + kPage + 3, kPage, {}).ok());
  Mapping m;
  ASSERT_TRUE(find_mapping(reinterpret_cast<uintptr_t>(f.base) + 5, &m));
  EXPECT_EQ(m.start, reinterpret_cast<uintptr_t>(f.base));
  EXPECT_EQ(m.end, reinterpret_cast<uintptr_t>(f.base) + 4 * kPage);
  EXPECT_TRUE(m.shared && m.writable);
}

TEST(ShmMapping, ASpanPastTheMappingIsRefused) {
  SharedFile f(4 * kPage, 4 * kPage);
  ASSERT_NE(f.base, nullptr);
  Status st = check_peer_mapping(f.base, 4 * kPage + 1, {});
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("past the peer's mapped segment"), std::string::npos) << st.message();
  EXPECT_EQ(check_peer_mapping(f.base + 3 * kPage, 2 * kPage, {}).code(), ErrorCode::kProtocolError);
}

// Issue 31: only the mapping the unpack created is accepted. A shared writable mapping that
// existed before (any memory of this process that is not a kvferry span: UCX's own segments, a
// second name for our own pool) is refused; the mapping created in between, of the named inode,
// passes. And a new mapping of a segment that holds a taken range (the same memory under a second
// address) is refused.
TEST(ShmMapping, OnlyTheMappingCreatedSinceTheSnapshotPasses) {
  SharedFile old_one(4 * kPage, 4 * kPage);
  ASSERT_NE(old_one.base, nullptr);
  std::vector<Mapping> before = read_mappings();
  ASSERT_FALSE(before.empty());
  void* p = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, old_one.fd, 0);  // same file, new mapping
  ASSERT_NE(p, MAP_FAILED);
  Mapping now;
  ASSERT_TRUE(find_mapping(reinterpret_cast<uintptr_t>(p), &now));
  std::vector<Mapping> fresh = new_mappings(before, read_mappings(), now.inode, true, now.device);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0].start, reinterpret_cast<uintptr_t>(p));
  EXPECT_TRUE(check_peer_mapping(p, kPage, {}, &fresh).ok());
  Status st = check_peer_mapping(old_one.base, kPage, {}, &fresh);  // writable, shared, but older
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("not in the mapping its remote key's unpack created"), std::string::npos) << st.message();
  EXPECT_EQ(new_mappings(before, read_mappings(), now.inode + 1, true, now.device).size(), 0u);
  // The old mapping holds a taken range (our own span, say): the new one is the same memory.
  const auto lo = reinterpret_cast<uintptr_t>(old_one.base);
  st = check_peer_mapping(p, kPage, {{lo, lo + kPage}}, &fresh);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("already maps"), std::string::npos) << st.message();
  munmap(p, 4 * kPage);
}

// The mapping is longer than its file: the pages past the file's end would raise SIGBUS on a put.
TEST(ShmMapping, AMappingPastItsFilesEndIsRefusedWithoutAFault) {
  SharedFile f(kPage, 4 * kPage);
  ASSERT_NE(f.base, nullptr);
  Status st = check_peer_mapping(f.base, 4 * kPage, {});
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("not backed"), std::string::npos) << st.message();
  EXPECT_TRUE(check_peer_mapping(f.base, kPage, {}).ok());  // the backed part is fine
}

TEST(ShmMapping, PrivateReadOnlyUnmappedAndTakenMemoryIsRefused) {
  std::vector<uint8_t> heap(8 * kPage);
  EXPECT_EQ(check_peer_mapping(heap.data(), kPage, {}).code(), ErrorCode::kProtocolError);  // private
  SharedFile ro(kPage, kPage, PROT_READ);
  ASSERT_NE(ro.base, nullptr);
  EXPECT_EQ(check_peer_mapping(ro.base, kPage, {}).code(), ErrorCode::kProtocolError);
  void* gone = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ASSERT_EQ(munmap(gone, kPage), 0);
  EXPECT_EQ(check_peer_mapping(gone, kPage, {}).code(), ErrorCode::kProtocolError);
  SharedFile f(4 * kPage, 4 * kPage);
  ASSERT_NE(f.base, nullptr);
  const auto lo = reinterpret_cast<uintptr_t>(f.base);
  Status st = check_peer_mapping(f.base, kPage, {{lo + 2 * kPage, lo + 3 * kPage}});  // same mapping
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("already maps"), std::string::npos) << st.message();
  EXPECT_TRUE(check_peer_mapping(f.base, kPage, {{lo + 4 * kPage, lo + 5 * kPage}}).ok());  // just after
  EXPECT_EQ(check_peer_mapping(f.base, 0, {}).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(check_peer_mapping(reinterpret_cast<void*>(UINTPTR_MAX - 2), 8, {}).code(), ErrorCode::kProtocolError);
}

struct ShmPair {
  std::unique_ptr<UcxTransport> a, b;
  LocalRegion ra, rb;
};

ShmPair shm_pair(uint64_t bytes) {
  ShmPair p;
  TransportOptions opt;
  opt.kind = TransportKind::kShm;
  auto a = UcxTransport::create(opt);
  auto b = UcxTransport::create(opt);
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return p;
  p.a = std::move(a.value());
  p.b = std::move(b.value());
  auto ra = p.a->create_region(bytes);
  EXPECT_TRUE(ra.ok());
  if (ra.ok()) p.ra = *ra;
  auto rb = p.b->create_region(bytes);
  EXPECT_TRUE(rb.ok());
  if (rb.ok()) p.rb = *rb;
  return p;
}

TEST(ShmMapping, APeerAnnouncingMoreThanItsSegmentIsRefusedAtConnect) {
  constexpr uint64_t kBytes = 1 << 20;
  ShmPair p = shm_pair(kBytes);
  ASSERT_TRUE(p.a && p.b);
  RemoteRegionInfo larger = testing::remote_info(*p.b, p.rb);
  larger.spans[0].bytes = 64 * kBytes;  // far past what its rkey maps
  auto id = p.a->connect(larger);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), ErrorCode::kProtocolError);
  EXPECT_NE(id.status().message().find("span 0 refused"), std::string::npos) << id.status().message();

  RemoteRegionInfo shifted = testing::remote_info(*p.b, p.rb);
  shifted.spans[0].base += 64 * kBytes;  // the same size, somewhere else in our address space
  auto id2 = p.a->connect(shifted);
  ASSERT_FALSE(id2.ok());
  EXPECT_EQ(id2.status().code(), ErrorCode::kProtocolError);

  // The honest announcement connects, and a write lands.
  testing::fill_pattern(p.ra.base, kBytes);
  std::memset(p.rb.base, 0xEE, kBytes);
  auto honest = p.a->connect(testing::remote_info(*p.b, p.rb));
  ASSERT_TRUE(honest.ok()) << honest.status().str();
  const std::vector<WriteOp> ops = {{0, 4096, 8192}, {kBytes - 8, kBytes - 8, 8}};
  ASSERT_TRUE(testing::write_and_wait(*p.a, *honest, 1, ops).ok());
  EXPECT_EQ(std::memcmp(p.rb.base, testing::expected_image(kBytes, 0xEE, ops).data(), kBytes), 0);
}

// Several transports of one process (prefill ranks of an in-process engine, or the shards of one
// rank) connecting to one peer's segment at once: each unpack's mapping is found new although the
// others attach and detach the same segment meanwhile (holds, unpacks, destroys). Before
// segment_mapping_lock (shm_segments.h) one transport's hold, detached between another's snapshot
// and unpack, freed the range the unpack then mapped again: the honest peer was refused ("span is
// not in the mapping its remote key's unpack created"; CI, ManagerLayers 2 prefill -> 1 decode).
TEST(ShmMapping, ConcurrentConnectsOfOneProcessToOneSegmentAllPass) {
  constexpr uint64_t kBytes = 1 << 20;
  constexpr int kSources = 3, kRounds = 30;
  TransportOptions opt;
  opt.kind = TransportKind::kShm;
  auto target = UcxTransport::create(opt);
  ASSERT_TRUE(target.ok());
  auto region = (*target)->create_region(kBytes);
  ASSERT_TRUE(region.ok());
  const RemoteRegionInfo info = testing::remote_info(**target, *region);
  std::vector<std::unique_ptr<UcxTransport>> sources;
  for (int i = 0; i < kSources; ++i) {
    auto t = UcxTransport::create(opt);
    ASSERT_TRUE(t.ok());
    sources.push_back(std::move(t.value()));
  }
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Result<PeerId>> got(kSources, Result<PeerId>(ErrorCode::kInternal, "not run"));
    std::vector<std::thread> threads;
    for (int i = 0; i < kSources; ++i) threads.emplace_back([&, i] { got[i] = sources[i]->connect(info); });
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < kSources; ++i) {
      ASSERT_TRUE(got[i].ok()) << "round " << round << " source " << i << ": " << got[i].status().str();
      sources[i]->disconnect(*got[i]);
    }
  }
}

}  // namespace
}  // namespace kvferry::ucx
