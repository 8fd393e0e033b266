// The validator of a peer's worker address and packed rkeys (ucx_layout.h, shm_segments.h) over
// real addresses and rkeys of this UCX (libucx0 1.13.1): one ucp context with two workers, the
// rank (A) and the peer (B), an endpoint A -> B. Real keys of the shm (sysv, posix) and tcp
// transports pass; truncations, md map and size mutations, extra bytes, random bytes and this
// rank's own address are refused; every 1-3 byte mutation of a real key is refused or, where
// accepted, unpacked by the real ucp_ep_rkey_unpack without error (issue 31: before the fix
// about 10% of them crashed UCX's unpack).
#include "transport/ucx/ucx_layout.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <ucp/api/ucp.h>
#include <ucs/algorithm/crc.h>

#include <memory>
#include <random>
#include <string>

#include "transport/ucx/shm_segments.h"

namespace kvferry::ucx {
namespace {

std::string address_of(ucp_worker_h w) {
  ucp_address_t* a = nullptr;
  size_t n = 0;
  EXPECT_EQ(ucp_worker_get_address(w, &a, &n), UCS_OK);
  std::string s(reinterpret_cast<const char*>(a), n);
  ucp_worker_release_address(w, a);
  return s;
}

// A context of `tls` with two workers, B's region and A's layout (as UcxTransport::learn_layout).
struct Pair {
  ucp_context_h ctx = nullptr;
  ucp_worker_h a = nullptr, b = nullptr;
  ucp_ep_h ep = nullptr;
  std::vector<ucp_mem_h> memhs;
  LocalUcxLayout local;
  std::string peer_address;
  WorkerAddressLayout peer;

  Pair(const char* tls, bool shm) {
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return;
    ucp_config_modify(config, "TLS", tls);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    ucs_status_t s = ucp_init(&params, config, &ctx);
    ucp_config_release(config);
    if (s != UCS_OK) return;
    ucp_worker_params_t wp{};
    if (ucp_worker_create(ctx, &wp, &a) != UCS_OK || ucp_worker_create(ctx, &wp, &b) != UCS_OK) return;
    local.shm_only = shm;
    EXPECT_TRUE(local.learn_address(address_of(a)).ok());
    EXPECT_TRUE(local.learn_rkey(rkey(true)).ok());  // the probe
    peer_address = address_of(b);
  }
  ~Pair() {
    if (ep != nullptr) {
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(ep, &prm);
      while (r != nullptr && !UCS_PTR_IS_ERR(r) && ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(a);
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
    }
    for (ucp_mem_h m : memhs) ucp_mem_unmap(ctx, m);
    if (a) ucp_worker_destroy(a);
    if (b) ucp_worker_destroy(b);
    if (ctx) ucp_cleanup(ctx);
  }
  bool ok() const { return a != nullptr && b != nullptr; }
  // A region of B (allocated: a shm segment; else registered memory) and its packed rkey.
  std::string rkey(bool allocate) {
    static std::vector<char> plain(1 << 16);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.length = 1 << 16;
    if (allocate) {
      mp.flags = UCP_MEM_MAP_ALLOCATE;
    } else {
      mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
      mp.address = plain.data();
    }
    ucp_mem_h m = nullptr;
    if (ucp_mem_map(ctx, &mp, &m) != UCS_OK) return {};
    memhs.push_back(m);
    void* buf = nullptr;
    size_t len = 0;
    EXPECT_EQ(ucp_rkey_pack(ctx, m, &buf, &len), UCS_OK);
    std::string s(static_cast<const char*>(buf), len);
    ucp_rkey_buffer_release(buf);
    return s;
  }
  Status check(const std::string& key, SegmentClaim* claim) {
    if (peer.ifaces.empty()) {
      EXPECT_TRUE(check_peer_address(local, peer_address, &peer).ok());
    }
    return check_peer_rkey(local, peer, key, claim);
  }
  // The validator and the segment hold accept `key`: then the real unpack must take it.
  bool accepted_and_unpacked(const std::string& key) {
    SegmentClaim claim;
    if (!check(key, &claim).ok()) return false;
    SegmentHold hold;
    if (!hold.acquire(claim).ok()) return false;
    if (ep == nullptr) {
      ucp_ep_params_t p{};
      p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      p.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
      EXPECT_EQ(ucp_ep_create(a, &p, &ep), UCS_OK);
    }
    ucp_rkey_h h = nullptr;
    const ucs_status_t s = ucp_ep_rkey_unpack(ep, key.data(), &h);
    EXPECT_EQ(s, UCS_OK) << "accepted by the validator, refused by UCX";
    if (s == UCS_OK) ucp_rkey_destroy(h);
    return true;
  }
};

TEST(UcxLayout, TransportChecksumsAreUcxsOwn) {
  for (const char* n : {"self", "tcp", "cma", "sysv", "posix"})
    EXPECT_STREQ(component_name(component_of_tl(ucs_crc16_string(n))), n);
}

TEST(UcxLayout, RealShmAndTcpKeysAndAddressesPass) {
  for (const char* tls : {"posix,sysv,self", "posix,self", "sysv,self", "tcp,self"}) {
    SCOPED_TRACE(tls);
    const bool shm = std::string(tls) != "tcp,self";
    Pair p(tls, shm);
    ASSERT_TRUE(p.ok());
    for (bool allocate : {true, false}) {
      const std::string key = p.rkey(allocate);
      ASSERT_FALSE(key.empty());
      SegmentClaim claim;
      Status st = p.check(key, &claim);
      EXPECT_TRUE(st.ok()) << st.message();
      if (shm && allocate) {
        EXPECT_NE(claim.component, UcxComponent::kUnknown);  // a sysv or posix segment
      }
      EXPECT_TRUE(p.accepted_and_unpacked(key));
    }
  }
}

TEST(UcxLayout, TruncationsExtraBytesAndMdMapOrSizeMutationsAreRefused) {
  Pair p("posix,sysv,self", true);
  ASSERT_TRUE(p.ok());
  const std::string key = p.rkey(true);
  SegmentClaim claim;
  for (size_t n = 0; n < key.size(); ++n)
    EXPECT_EQ(p.check(key.substr(0, n), &claim).code(), ErrorCode::kProtocolError) << n << " bytes";
  EXPECT_EQ(p.check(key + '\0', &claim).code(), ErrorCode::kProtocolError);
  for (unsigned bit = 0; bit < 64; ++bit) {  // md map: every other md set or one of ours cleared
    std::string k = key;
    k[bit / 8] = static_cast<char>(k[bit / 8] ^ (1 << (bit % 8)));
    EXPECT_EQ(p.check(k, &claim).code(), ErrorCode::kProtocolError) << "md bit " << bit;
  }
  std::string k = key;
  k[8] = 9;  // a memory type this UCX does not support
  EXPECT_EQ(p.check(k, &claim).code(), ErrorCode::kProtocolError);
  PackedRkeyLayout parsed;
  ASSERT_TRUE(parse_packed_rkey(key, &parsed).ok());
  for (const RkeyPart& part : parsed.parts) {  // each component's size byte, one more and one less
    const size_t at = static_cast<size_t>(part.packed.data() - key.data()) - 1;
    for (int d : {-1, 1}) {
      std::string m = key;
      m[at] = static_cast<char>(static_cast<uint8_t>(m[at]) + d);
      EXPECT_EQ(p.check(m, &claim).code(), ErrorCode::kProtocolError) << "md " << part.md_index << " size " << d;
    }
  }
}

TEST(UcxLayout, RandomBytesAreRefused) {
  Pair p("posix,sysv,self", true);
  ASSERT_TRUE(p.ok());
  std::mt19937 rng(31);
  SegmentClaim claim;
  for (int i = 0; i < 2000; ++i) {
    std::string k(64, '\0');
    for (char& c : k) c = static_cast<char>(rng());
    EXPECT_FALSE(p.check(k, &claim).ok()) << i;
  }
}

// Issue 31: 1-3 byte mutations of a real key: refused, or accepted and unpacked without error.
TEST(UcxLayout, SmallMutationsOfARealKeyNeverReachAFailingUnpack) {
  for (const char* tls : {"posix,sysv,self", "posix,self"}) {
    SCOPED_TRACE(tls);
    Pair p(tls, true);
    ASSERT_TRUE(p.ok());
    const std::string key = p.rkey(true);
    std::mt19937 rng(7);
    size_t accepted = 0;
    for (int i = 0; i < 1500; ++i) {
      std::string k = key;
      for (int n = 1 + i % 3; n > 0; --n) k[rng() % k.size()] = static_cast<char>(rng());
      accepted += p.accepted_and_unpacked(k);
    }
    EXPECT_GT(accepted, 0u) << "no mutation was accepted: the test would not see a validator hole";
  }
}

TEST(UcxLayout, OwnAndSelfAliasingAddressesAreRefused) {
  Pair p("posix,sysv,self", true);
  ASSERT_TRUE(p.ok());
  WorkerAddressLayout parsed;
  Status st = check_peer_address(p.local, p.local.address, &parsed);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("this rank's own"), std::string::npos) << st.message();
  std::string other_uuid = p.local.address;
  other_uuid[1] = static_cast<char>(other_uuid[1] ^ 0x5a);  // v1: the uuid follows the header byte
  st = check_peer_address(p.local, other_uuid, &parsed);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("own"), std::string::npos) << st.message();  // its self iface is ours
  for (size_t n = 0; n < p.peer_address.size(); ++n)
    EXPECT_EQ(check_peer_address(p.local, p.peer_address.substr(0, n), &parsed).code(), ErrorCode::kProtocolError) << n;
  EXPECT_EQ(check_peer_address(p.local, p.peer_address + 'x', &parsed).code(), ErrorCode::kProtocolError);
  EXPECT_TRUE(check_peer_address(p.local, p.peer_address, &parsed).ok());
  // A key naming one of this rank's own segments (its own region, as a peer would replay it).
  Pair q("posix,sysv,self", true);
  ASSERT_TRUE(q.ok());
  const std::string own = q.rkey(true);
  ASSERT_TRUE(q.local.learn_rkey(own).ok());  // registered by this rank (UcxTransport::map_span)
  SegmentClaim claim;
  st = q.check(own, &claim);
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("segment of this rank"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kvferry::ucx
