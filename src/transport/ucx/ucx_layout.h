// A peer's UCX worker address and packed remote keys, parsed completely before UCX sees a byte
// (docs/security.md "Remote keys and worker addresses", docs/transport.md "What reaches UCX").
//
// UCX 1.13 parses both without a length and trusts every byte: ucp_ep_create aborts on an unknown
// address version, and ucp_ep_rkey_unpack, when one component's unpack fails, releases the
// handles of components it never unpacked (ucp_rkey.c: ucp_ep_rkey_unpack_internal ->
// ucp_rkey_destroy -> uct_rkey_release on an uninitialised handle: a segfault). So a peer's bytes
// are parsed here against the layouts of UCX 1.13.1 (facts read from its source, cited beside
// each) and against what this rank's own UCX produces (the same build and UCX_TLS on every rank,
// docs/transport.md), and anything else is refused with kProtocolError.
//
// Layouts (UCX 1.13.1):
//  worker address (src/ucp/wireup/address.c, ucp_address_do_pack / ucp_address_unpack, packed
//    with ucp_worker_default_address_pack_flags: uuid, name if debug info, device, iface and no
//    ep addresses, no rsc index, not unified mode):
//    header: v1 one byte (version in the low 4 bits, flags above), v2 two bytes (version, flags);
//    [uuid u64 if v1 or flag WORKER_UUID] [client id u64 if flag CLIENT_ID] [name: len u8 + bytes
//    if flag DEBUG_INFO]; then 0xff (no devices) or devices, each: md byte (index in the low 5
//    bits v1 / 7 bits v2 with an extension byte at 127, 0x80 = no transports), device length byte
//    (length in the low 5 bits, extension at 31 in v2; 0x80 last device, 0x40 num_paths byte
//    follows, 0x20 sys_dev byte follows), the device address; then per transport: tl name
//    checksum u16 (ucs_crc16_string of the tl name), iface attributes (v1 16 bytes, v2 8 bytes),
//    iface length byte (low 6 bits, extension at 63 in v2; 0x80 last transport, 0x40 ep
//    addresses follow), the iface address, and ep addresses (length u8, bytes, lane byte with
//    0x80 last) when flagged.
//  packed rkey (src/ucp/core/ucp_rkey.c, ucp_rkey_packed_copy / ucp_rkey_pack_common): md_map
//    u64, memory type u8, then per set bit of md_map in order: size u8 + that component's packed
//    rkey; then, only when packed with a system device (never by ucp_rkey_pack), a sys_dev byte
//    and distances: refused here (the packed length must be exact).
//  component rkeys: self, tcp, cma: 0 bytes (self.c, tcp_md.c, cma_md.c: rkey_packed_size = 0);
//    sysv: shmid u32 + owner_ptr u64 (mm_sysv.c uct_sysv_packed_rkey_t); posix: seg_id u64
//    (flags in bits 60..63, procfs mode: pid in bits 0..29, fd in bits 30..59), address u64,
//    length u64, then the md's iface address extension (a PID namespace id or a directory, as in
//    the posix iface address after its 8-byte fifo seg_id) (mm_posix.c uct_posix_packed_rkey_t,
//    uct_posix_iface_addr_length). An mm iface address starts with the fifo's seg_id u64
//    (mm_iface.h uct_mm_iface_addr_t).
//
// Thread contract: pure functions and plain data; safe from any thread.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::ucx {

// The transports whose layouts are known here, by UCX's checksum of the tl name.
enum class UcxComponent { kUnknown, kSelf, kTcp, kCma, kSysv, kPosix };
UcxComponent component_of_tl(uint16_t tl_name_csum);
const char* component_name(UcxComponent c);
bool is_shm_component(UcxComponent c);  // self, cma, sysv, posix

struct AddressIface {
  unsigned md_index = 0;
  uint16_t tl_csum = 0;
  std::string device;  // device address
  std::string iface;   // iface address
};

struct WorkerAddressLayout {
  unsigned version = 0;
  uint8_t flags = 0;
  uint64_t uuid = 0;
  std::vector<AddressIface> ifaces;
  uint64_t md_map = 0;  // md indices of devices that carry transports
};

// Errors: kProtocolError naming the byte that does not fit (truncated, a length past the end,
// an unknown version, more than UCX's limits, trailing bytes, no transport at all).
Status parse_worker_address(std::string_view bytes, WorkerAddressLayout* out);

struct RkeyPart {
  unsigned md_index = 0;
  std::string_view packed;  // into the parsed buffer
};
struct PackedRkeyLayout {
  uint64_t md_map = 0;
  uint8_t mem_type = 0;
  std::vector<RkeyPart> parts;  // one per set bit of md_map, in order
};
// Structure only (sizes consistent, exact length). Errors: kProtocolError.
Status parse_packed_rkey(std::string_view bytes, PackedRkeyLayout* out);

// A shared-memory segment a peer's rkey names (what UCX's unpack would attach).
struct SegmentClaim {
  UcxComponent component = UcxComponent::kUnknown;  // kSysv or kPosix
  uint64_t id = 0;          // sysv: shmid; posix: seg_id without flags (procfs: pid | fd << 30)
  uint64_t flags = 0;       // posix seg_id flags
  uint64_t length = 0;      // posix: bytes UCX maps
  std::string dir;          // posix, not procfs nor shm_open: the directory of the file
  uint64_t peer_fifo = 0;   // the peer's own fifo segment of the same transport (its address)
  bool has_peer_fifo = false;
};

// What this rank's own UCX produces, learned at start (own worker address, own packed rkeys).
struct LocalUcxLayout {
  std::string address;                         // our own worker address, as packed
  WorkerAddressLayout own;                     // ... parsed
  std::map<unsigned, std::set<UcxComponent>> md_components;  // md index -> its transports
  std::map<unsigned, size_t> rkey_sizes;       // md index -> packed size of our own rkeys
  uint64_t memory_types = 1;                   // UCS_BIT(ucs_memory_type_t) a peer's rkey may name
  bool shm_only = false;                       // put over shm: only shm components in rkeys
  std::set<std::pair<UcxComponent, uint64_t>> own_segments;  // our spans' and fifos' segments

  // Errors: kInternal (our own address or rkey does not parse: not the layout of UCX 1.13).
  Status learn_address(const std::string& own_address);
  Status learn_rkey(std::string_view own_rkey);
  // The packed size of md `md`'s component rkey, or SIZE_MAX when unknown.
  size_t expected_rkey_size(unsigned md, const WorkerAddressLayout& peer) const;
};

// A peer's worker address: parses, has our version, names only md indices and transports our
// own address has (with iface addresses of our lengths), and is not ours (same bytes, our uuid,
// or one of our own iface addresses: a self-connection; over `self`, a put would be a memcpy to
// any address the peer names). Errors: kProtocolError.
Status check_peer_address(const LocalUcxLayout& local, std::string_view peer, WorkerAddressLayout* parsed);

// A peer's packed rkey, against its parsed address: md map a subset of the transports the peer
// announces and we have (shm_only: of shm components), every component's size exact and its
// contents plausible (no segment of ours or the peer's fifo; posix flags ours, its pid the
// peer's), our memory types, exact total length, at most one segment. *segment: the segment UCX
// would attach (component kUnknown: none). Errors: kProtocolError.
Status check_peer_rkey(const LocalUcxLayout& local, const WorkerAddressLayout& peer, std::string_view rkey,
                       SegmentClaim* segment);

}  // namespace kvferry::ucx
