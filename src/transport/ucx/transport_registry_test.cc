// The transport registry (names, unknown names, registration) and what a transport reports about
// itself (caps) and refuses at registration.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "kvferry/transport.h"

namespace kvferry {
namespace {

TEST(TransportRegistryTest, ShmAndTcpAreBuiltInAndListedSorted) {
  std::vector<std::string> names = transport_names();
  ASSERT_GE(names.size(), 2u);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_NE(std::find(names.begin(), names.end(), "shm"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "tcp"), names.end());
  EXPECT_TRUE(check_transport_name("shm").ok());
  EXPECT_TRUE(check_transport_name("tcp").ok());
  std::string text = describe_transports();
  EXPECT_NE(text.find("shm: UCX over shared memory"), std::string::npos) << text;
  EXPECT_NE(text.find("tcp: UCX over TCP"), std::string::npos) << text;
}

TEST(TransportRegistryTest, UnknownNameListsTheKnownOnes) {
  for (const char* name : {"rdma", "", "SHM", "shm "}) {
    Status st = check_transport_name(name);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << name;
    // (another test may add a name after these two)
    EXPECT_TRUE(st.message().starts_with("unknown transport '" + std::string(name) +
                                         "' (known: shm, tcp"))
        << st.message();
    auto t = make_transport(name);
    EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(t.status().message(), st.message());
  }
}

TEST(TransportRegistryTest, MakeTransportBuildsTheNamedKind) {
  for (const char* name : {"shm", "tcp"}) {
    TransportOptions o;
    o.kind = TransportKind::kTcp;  // overridden by the name
    if (std::string(name) == "tcp") o.kind = TransportKind::kShm;
    o.shards = 2;
    auto t = make_transport(name, o);
    ASSERT_TRUE(t.ok()) << t.status().str();
    TransportCaps c = (*t)->caps();
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(c.one_sided_put, std::string(name) == "shm");
    EXPECT_TRUE(c.receiver_copy);
    EXPECT_TRUE(c.supports(MemoryKind::kHost));
    EXPECT_EQ(c.max_spans, kMaxTransportSpans);
  }
  TransportOptions bad;
  bad.shards = 0;  // the factory's own errors come through
  EXPECT_EQ(make_transport("tcp", bad).status().code(), ErrorCode::kInvalidArgument);
}

TEST(TransportRegistryTest, AddedFactoriesAreFoundAndNamesStayUnique) {
  std::atomic<int> made{0};
  TransportFactory f{"test-loopback", "a test double",
                     [&made](const TransportOptions& o) -> Result<std::unique_ptr<Transport>> {
                       made++;
                       return make_transport("tcp", o);
                     }};
  ASSERT_TRUE(register_transport(f).ok());
  EXPECT_EQ(register_transport(f).code(), ErrorCode::kInvalidArgument);  // taken
  EXPECT_EQ(register_transport({"", "x", f.make}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(register_transport({"nothing", "x", nullptr}).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(check_transport_name("test-loopback").ok());
  auto t = make_transport("test-loopback");
  ASSERT_TRUE(t.ok()) << t.status().str();
  EXPECT_EQ(made.load(), 1);
  EXPECT_NE(check_transport_name("rdma").message().find("known: shm, tcp, test-loopback"),
            std::string::npos);
}

// This machine's UCX (Debian's) has no CUDA support: the caps say so and registration refuses a
// device span with a message naming what is missing; on a UCX with CUDA, shm must list kCuda.
TEST(TransportRegistryTest, DeviceMemoryIsRefusedWithTheMissingUcxSupportNamed) {
  for (const char* name : {"shm", "tcp"}) {
    auto t = make_transport(name);
    ASSERT_TRUE(t.ok()) << t.status().str();
    TransportCaps c = (*t)->caps();
    std::vector<uint8_t> mem(4096);
    MemorySpan span{mem.data(), mem.size(), 0, MemoryKind::kCuda};
    if (c.supports(MemoryKind::kCuda)) {
      EXPECT_STREQ(name, "shm");  // tcp copies with the CPU: never device memory
      EXPECT_TRUE(c.cuda_missing.empty());
      continue;
    }
    EXPECT_NE(c.cuda_missing.find("cuda_copy/cuda_ipc"), std::string::npos) << c.cuda_missing;
    EXPECT_NE(c.cuda_missing.find("--with-cuda"), std::string::npos) << c.cuda_missing;
    auto r = (*t)->register_spans({span});
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("span 0 is cuda memory"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find(c.cuda_missing), std::string::npos);
    // Nothing was registered: host memory still can be.
    span.memory = MemoryKind::kHost;
    EXPECT_TRUE((*t)->register_spans({span}).ok());
  }
}

TEST(TransportRegistryTest, RegisterSpansChecksItsSpans) {
  auto t = make_transport("tcp");
  ASSERT_TRUE(t.ok());
  std::vector<uint8_t> a(8192), b(8192);
  auto bad = [&](std::vector<MemorySpan> spans, const char* what) {
    auto r = (*t)->register_spans(spans);
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << what;
    return r.status().message();
  };
  bad({}, "no spans");
  bad({{nullptr, 10, 0}}, "null base");
  bad({{a.data(), 0, 0}}, "empty");
  EXPECT_NE(bad({{a.data(), 8192, 0}, {b.data(), 8192, 4096}}, "overlap").find("overlaps"),
            std::string::npos);
  bad({{a.data(), 8192, UINT64_MAX - 100}}, "offset + bytes overflows");
  std::vector<MemorySpan> many(kMaxTransportSpans + 1, MemorySpan{a.data(), 1, 0});
  for (size_t i = 0; i < many.size(); ++i) many[i].offset = i;
  bad(many, "too many");
  auto ok = (*t)->register_spans({{b.data(), 8192, 1 << 20}, {a.data(), 8192, 0}});
  ASSERT_TRUE(ok.ok()) << ok.status().str();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].offset, 1u << 20);
  EXPECT_EQ((*ok)[0].base, b.data());
  EXPECT_EQ((*ok)[1].offset, 0u);
  bad({{a.data(), 8192, 0}}, "twice");
  EXPECT_EQ((*t)->create_region(4096).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvferry
