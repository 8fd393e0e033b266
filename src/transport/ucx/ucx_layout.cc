// Parsers and checks of a peer's UCX worker address and packed rkeys (ucx_layout.h). Every fact
// about a layout names the UCX 1.13.1 source it comes from.
#include "transport/ucx/ucx_layout.h"

#include <cstring>

namespace kvferry::ucx {
namespace {

// address.c / address.h (UCX 1.13.1).
constexpr unsigned kAddressV1 = 0, kAddressV2 = 1;       // ucp_object_version_t
constexpr uint8_t kHeaderFlagDebugInfo = 1, kHeaderFlagUuid = 2, kHeaderFlagClientId = 4;
constexpr uint8_t kNullResource = 0xff;                   // UCP_NULL_RESOURCE: no devices
constexpr uint8_t kMdEmptyDev = 0x80;                     // UCP_ADDRESS_FLAG_MD_EMPTY_DEV
constexpr uint8_t kMdMaskV1 = 0x1f, kMdMaskV2 = 0x7f;     // UCP_ADDRESS_FLAG_MD_MASK(_V1)
constexpr uint8_t kFlagLast = 0x80, kFlagNumPaths = 0x40, kFlagSysDevice = 0x20, kFlagHasEpAddr = 0x40;
constexpr uint8_t kDeviceLenMask = 0x1f;                  // UCP_ADDRESS_DEVICE_LEN_MASK
constexpr uint8_t kIfaceLenMask = 0x3f;                   // UCP_ADDRESS_IFACE_LEN_MASK
constexpr size_t kIfaceAttrV1 = 16, kIfaceAttrV2 = 8;     // ucp_address_(v2_)packed_iface_attr_t
constexpr size_t kMaxResources = 128;                     // UCP_MAX_RESOURCES (ucp_types.h)
constexpr size_t kMaxLanes = 6;                           // UCP_MAX_LANES
constexpr unsigned kMdIndexBits = 64;                     // UCP_MD_INDEX_BITS

// mm_posix.c: seg_id flags.
constexpr uint64_t kPosixProcfs = 1ull << 63, kPosixShmOpen = 1ull << 62, kPosixHugetlb = 1ull << 61,
                   kPosixPidNs = 1ull << 60;
constexpr uint64_t kPosixFlags = kPosixProcfs | kPosixShmOpen | kPosixHugetlb | kPosixPidNs;
constexpr unsigned kPosixPidBits = 30;  // UCT_POSIX_PROCFS_MMID_PID_BITS
constexpr size_t kPosixRkeyFixed = 24;  // uct_posix_packed_rkey_t
constexpr size_t kSysvRkey = 12;        // uct_sysv_packed_rkey_t
constexpr size_t kFifoSegId = 8;        // uct_mm_iface_addr_t
constexpr uint64_t kMaxSegmentBytes = 1ull << 48;

Status bad(const std::string& what) { return {ErrorCode::kProtocolError, what}; }

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  bool take(size_t n, std::string_view* out) {
    if (n > b_.size() - at_) return false;
    if (out != nullptr) *out = b_.substr(at_, n);
    at_ += n;
    return true;
  }
  bool byte(uint8_t* v) {
    std::string_view s;
    if (!take(1, &s)) return false;
    *v = static_cast<uint8_t>(s[0]);
    return true;
  }
  bool peek(uint8_t* v) const {
    if (at_ >= b_.size()) return false;
    *v = static_cast<uint8_t>(b_[at_]);
    return true;
  }
  bool u64(uint64_t* v) {
    std::string_view s;
    if (!take(8, &s)) return false;
    std::memcpy(v, s.data(), 8);  // little-endian hosts only, like UCX's own wire format
    return true;
  }
  // ucp_address_unpack_byte_extended: value in `mask` bits; in v2 the mask value means "next byte".
  bool extended(uint8_t mask, unsigned version, uint8_t* v) {
    uint8_t b = 0;
    if (!byte(&b)) return false;
    *v = b & mask;
    if (version != kAddressV1 && *v == mask) return byte(v);
    return true;
  }
  size_t at() const { return at_; }
  bool done() const { return at_ == b_.size(); }

 private:
  std::string_view b_;
  size_t at_ = 0;
};

uint64_t load_u64(std::string_view s) {
  uint64_t v = 0;
  std::memcpy(&v, s.data(), std::min<size_t>(8, s.size()));
  return v;
}

std::string at_byte(const Reader& r) { return " at byte " + std::to_string(r.at()); }

}  // namespace

UcxComponent component_of_tl(uint16_t csum) {
  // ucs_crc16_string of the tl names (ucs/algorithm/crc.c; ucx_layout_test checks them).
  switch (csum) {
    case 0x7563: return UcxComponent::kSelf;
    case 0x19cf: return UcxComponent::kTcp;
    case 0x8b47: return UcxComponent::kCma;
    case 0x538d: return UcxComponent::kSysv;
    case 0xd3a7: return UcxComponent::kPosix;
    default: return UcxComponent::kUnknown;
  }
}

const char* component_name(UcxComponent c) {
  switch (c) {
    case UcxComponent::kSelf: return "self";
    case UcxComponent::kTcp: return "tcp";
    case UcxComponent::kCma: return "cma";
    case UcxComponent::kSysv: return "sysv";
    case UcxComponent::kPosix: return "posix";
    default: return "unknown";
  }
}

bool is_shm_component(UcxComponent c) {
  return c == UcxComponent::kSelf || c == UcxComponent::kCma || c == UcxComponent::kSysv ||
         c == UcxComponent::kPosix;
}

Status parse_worker_address(std::string_view bytes, WorkerAddressLayout* out) {
  *out = {};
  Reader r(bytes);
  uint8_t h = 0;
  if (!r.byte(&h)) return bad("worker address: empty");
  out->version = h & 0x0f;
  if (out->version == kAddressV1) {
    out->flags = h >> 4;
  } else if (out->version == kAddressV2) {
    if (!r.byte(&out->flags)) return bad("worker address: truncated header");
  } else {
    return bad("worker address: UCX address version " + std::to_string(out->version) + " unknown");
  }
  // ucp_address_unpack: v1 always carries the uuid (ucp_ep_create unpacks with WORKER_UUID).
  if (out->version == kAddressV1 || (out->flags & kHeaderFlagUuid)) {
    if (!r.u64(&out->uuid)) return bad("worker address: truncated uuid");
  }
  if ((out->flags & kHeaderFlagClientId) && !r.take(8, nullptr)) return bad("worker address: truncated client id");
  if (out->flags & kHeaderFlagDebugInfo) {
    uint8_t n = 0;
    if (!r.byte(&n) || !r.take(n, nullptr)) return bad("worker address: truncated worker name");
  }
  uint8_t first = 0;
  if (!r.peek(&first)) return bad("worker address: no device list");
  if (first == kNullResource) return bad("worker address announces no transport");
  const uint8_t md_mask = out->version == kAddressV1 ? kMdMaskV1 : kMdMaskV2;
  bool last_dev = false;
  while (!last_dev) {
    uint8_t md_byte = 0, md = 0, dev_flags = 0, dev_len = 0;
    if (!r.peek(&md_byte) || !r.extended(md_mask, out->version, &md)) return bad("worker address: truncated device" + at_byte(r));
    if (md >= kMdIndexBits) return bad("worker address: md index " + std::to_string(md) + at_byte(r));
    if (!r.peek(&dev_flags) || !r.extended(kDeviceLenMask, out->version, &dev_len))
      return bad("worker address: truncated device length" + at_byte(r));
    last_dev = dev_flags & kFlagLast;
    if ((dev_flags & kFlagNumPaths) && !r.take(1, nullptr)) return bad("worker address: truncated num_paths");
    if ((dev_flags & kFlagSysDevice) && !r.take(1, nullptr)) return bad("worker address: truncated sys_dev");
    std::string_view device;
    if (!r.take(dev_len, &device)) return bad("worker address: device address past the end" + at_byte(r));
    bool last_tl = md_byte & kMdEmptyDev;
    if (!last_tl) out->md_map |= 1ull << md;
    while (!last_tl) {
      if (out->ifaces.size() >= kMaxResources) return bad("worker address: more than 128 transports");
      AddressIface a;
      a.md_index = md;
      a.device.assign(device);
      std::string_view csum, iface;
      if (!r.take(2, &csum)) return bad("worker address: truncated transport" + at_byte(r));
      a.tl_csum = static_cast<uint16_t>(static_cast<uint8_t>(csum[0]) | (static_cast<uint8_t>(csum[1]) << 8));
      if (!r.take(out->version == kAddressV1 ? kIfaceAttrV1 : kIfaceAttrV2, nullptr))
        return bad("worker address: truncated iface attributes" + at_byte(r));
      uint8_t len_byte = 0, iface_len = 0;
      if (!r.peek(&len_byte) || !r.extended(kIfaceLenMask, out->version, &iface_len))
        return bad("worker address: truncated iface length" + at_byte(r));
      last_tl = len_byte & kFlagLast;
      if (!r.take(iface_len, &iface)) return bad("worker address: iface address past the end" + at_byte(r));
      a.iface.assign(iface);
      bool last_ep = !(len_byte & kFlagHasEpAddr);
      for (size_t eps = 0; !last_ep; ++eps) {
        uint8_t ep_len = 0, lane = 0;
        if (eps >= kMaxLanes) return bad("worker address: more than 6 ep addresses");
        if (!r.byte(&ep_len) || !r.take(ep_len, nullptr) || !r.byte(&lane))
          return bad("worker address: truncated ep address" + at_byte(r));
        last_ep = lane & kFlagLast;
      }
      out->ifaces.push_back(std::move(a));
    }
  }
  if (!r.done()) return bad("worker address: " + std::to_string(bytes.size() - r.at()) + " bytes after its last device");
  if (out->ifaces.empty()) return bad("worker address announces no transport");
  return Status::Ok();
}

Status parse_packed_rkey(std::string_view bytes, PackedRkeyLayout* out) {
  *out = {};
  Reader r(bytes);
  if (!r.u64(&out->md_map) || !r.byte(&out->mem_type)) return bad("remote key of " + std::to_string(bytes.size()) + " bytes: truncated header");
  for (unsigned md = 0; md < kMdIndexBits; ++md) {
    if (!(out->md_map & (1ull << md))) continue;
    uint8_t size = 0;
    RkeyPart p;
    p.md_index = md;
    if (!r.byte(&size) || !r.take(size, &p.packed))
      return bad("remote key: md " + std::to_string(md) + "'s part runs past its " + std::to_string(bytes.size()) + " bytes");
    out->parts.push_back(p);
  }
  if (!r.done()) return bad("remote key: " + std::to_string(bytes.size() - r.at()) + " bytes after its last part");
  return Status::Ok();
}

Status LocalUcxLayout::learn_address(const std::string& own_address) {
  Status st = parse_worker_address(own_address, &own);
  if (!st.ok()) return {ErrorCode::kInternal, "this rank's own " + st.message() + " (not UCX 1.13's layout)"};
  address = own_address;
  for (const AddressIface& a : own.ifaces) {
    const UcxComponent c = component_of_tl(a.tl_csum);
    md_components[a.md_index].insert(c);
    if ((c == UcxComponent::kSysv || c == UcxComponent::kPosix) && a.iface.size() >= kFifoSegId) {
      const uint64_t fifo = load_u64(a.iface);
      own_segments.insert({c, c == UcxComponent::kPosix ? fifo & ~kPosixFlags : fifo});
    }
  }
  return Status::Ok();
}

Status LocalUcxLayout::learn_rkey(std::string_view own_rkey) {
  PackedRkeyLayout k;
  Status st = parse_packed_rkey(own_rkey, &k);
  if (!st.ok()) return {ErrorCode::kInternal, "this rank's own " + st.message() + " (not UCX 1.13's layout)"};
  for (const RkeyPart& p : k.parts) {
    rkey_sizes[p.md_index] = p.packed.size();
    auto it = md_components.find(p.md_index);
    if (it == md_components.end() || p.packed.size() < 8) continue;
    if (it->second.count(UcxComponent::kSysv)) {
      own_segments.insert({UcxComponent::kSysv, load_u64(p.packed.substr(0, 4))});
    } else if (it->second.count(UcxComponent::kPosix)) {
      own_segments.insert({UcxComponent::kPosix, load_u64(p.packed) & ~kPosixFlags});
    }
  }
  return Status::Ok();
}

namespace {

const AddressIface* iface_of(const WorkerAddressLayout& a, unsigned md, UcxComponent c) {
  for (const AddressIface& i : a.ifaces)
    if (i.md_index == md && component_of_tl(i.tl_csum) == c) return &i;
  return nullptr;
}

UcxComponent single_component(const LocalUcxLayout& local, unsigned md) {
  auto it = local.md_components.find(md);
  if (it == local.md_components.end() || it->second.size() != 1) return UcxComponent::kUnknown;
  return *it->second.begin();
}

}  // namespace

size_t LocalUcxLayout::expected_rkey_size(unsigned md, const WorkerAddressLayout& /*peer*/) const {
  auto learned = rkey_sizes.find(md);
  if (learned != rkey_sizes.end()) return learned->second;
  switch (single_component(*this, md)) {
    case UcxComponent::kSelf:
    case UcxComponent::kTcp:
    case UcxComponent::kCma: return 0;
    case UcxComponent::kSysv: return kSysvRkey;
    case UcxComponent::kPosix: {
      const AddressIface* own_iface = iface_of(own, md, UcxComponent::kPosix);
      if (own_iface == nullptr || own_iface->iface.size() < kFifoSegId) return SIZE_MAX;
      return kPosixRkeyFixed + own_iface->iface.size() - kFifoSegId;  // uct_posix_iface_addr_length
    }
    default: return SIZE_MAX;
  }
}

Status check_peer_address(const LocalUcxLayout& local, std::string_view peer, WorkerAddressLayout* parsed) {
  Status st = parse_worker_address(peer, parsed);
  if (!st.ok()) return {st.code(), "peer " + st.message()};
  if (parsed->version != local.own.version)
    return bad("peer worker address of UCX address version " + std::to_string(parsed->version) + ", ours is " +
               std::to_string(local.own.version));
  if (peer == local.address) return bad("peer worker address is this rank's own");
  if (parsed->uuid != 0 && parsed->uuid == local.own.uuid) return bad("peer worker address carries this rank's worker uuid");
  for (const AddressIface& a : parsed->ifaces) {
    const AddressIface* mine = nullptr;
    for (const AddressIface& o : local.own.ifaces) {
      if (o.md_index != a.md_index || o.tl_csum != a.tl_csum) continue;
      mine = &o;
      if (o.device == a.device && o.iface == a.iface)
        return bad(std::string("peer worker address names this rank's own ") + component_name(component_of_tl(a.tl_csum)) +
                   " interface");
    }
    if (mine == nullptr)
      return bad("peer worker address announces transport " + std::to_string(a.tl_csum) + " on md " +
                 std::to_string(a.md_index) + ", which this rank's UCX does not have there");
    if (mine->iface.size() != a.iface.size())
      return bad(std::string("peer's ") + component_name(component_of_tl(a.tl_csum)) + " iface address of " +
                 std::to_string(a.iface.size()) + " bytes, ours has " + std::to_string(mine->iface.size()));
  }
  return Status::Ok();
}

namespace {

Status check_posix_part(const LocalUcxLayout& local, const WorkerAddressLayout& peer, const RkeyPart& p,
                        SegmentClaim* claim) {
  const uint64_t seg_id = load_u64(p.packed.substr(0, 8));
  const uint64_t address = load_u64(p.packed.substr(8, 8));
  const uint64_t length = load_u64(p.packed.substr(16, 8));
  const std::string_view ext = p.packed.substr(kPosixRkeyFixed);
  const AddressIface* own_iface = iface_of(local.own, p.md_index, UcxComponent::kPosix);
  const AddressIface* peer_iface = iface_of(peer, p.md_index, UcxComponent::kPosix);
  if (own_iface == nullptr || peer_iface == nullptr || peer_iface->iface.size() < kFifoSegId ||
      own_iface->iface.size() < kFifoSegId)
    return bad("posix remote key without a posix transport in both addresses");
  const uint64_t own_fifo = load_u64(own_iface->iface), peer_fifo = load_u64(peer_iface->iface);
  const uint64_t mode = kPosixProcfs | kPosixShmOpen | kPosixPidNs;
  // MAP_HUGETLB on a tmpfs file fails in UCX's attach, and a failed attach crashes the unpack.
  if (seg_id & kPosixHugetlb) return bad("posix remote key asks for a huge-page mapping");
  if ((seg_id & mode) != (own_fifo & mode) || (peer_fifo & mode) != (own_fifo & mode))
    return bad("posix remote key in another sharing mode than this rank's UCX");
  if (ext != std::string_view(own_iface->iface).substr(kFifoSegId) ||
      ext != std::string_view(peer_iface->iface).substr(kFifoSegId))
    return bad("posix remote key names another namespace or directory");
  if (address == 0 || length == 0 || length > kMaxSegmentBytes)
    return bad("posix remote key of segment length " + std::to_string(length));
  const uint64_t mmid = seg_id & ~kPosixFlags, peer_mmid = peer_fifo & ~kPosixFlags;
  const uint64_t pid_mask = (1ull << kPosixPidBits) - 1;
  if ((seg_id & kPosixProcfs) && (mmid & pid_mask) != (peer_mmid & pid_mask))
    return bad("posix remote key names a segment of another process than the peer's");
  if (mmid == peer_mmid) return bad("posix remote key names the peer's own UCX fifo");
  if (local.own_segments.count({UcxComponent::kPosix, mmid})) return bad("posix remote key names a segment of this rank");
  claim->component = UcxComponent::kPosix;
  claim->id = mmid;
  claim->flags = seg_id & kPosixFlags;
  claim->length = length;
  claim->peer_fifo = peer_mmid;
  claim->has_peer_fifo = true;
  if (!(seg_id & (kPosixProcfs | kPosixShmOpen))) claim->dir.assign(ext.substr(0, ext.find('\0')));
  return Status::Ok();
}

Status check_sysv_part(const LocalUcxLayout& local, const WorkerAddressLayout& peer, const RkeyPart& p,
                       SegmentClaim* claim) {
  const uint64_t shmid = load_u64(p.packed.substr(0, 4));
  const uint64_t owner = load_u64(p.packed.substr(4, 8));
  const AddressIface* peer_iface = iface_of(peer, p.md_index, UcxComponent::kSysv);
  if (peer_iface == nullptr || peer_iface->iface.size() < kFifoSegId)
    return bad("sysv remote key without a sysv transport in the peer's address");
  if (shmid > INT32_MAX || owner == 0) return bad("sysv remote key of shmid " + std::to_string(shmid));
  const uint64_t peer_fifo = load_u64(peer_iface->iface);
  if (shmid == peer_fifo) return bad("sysv remote key names the peer's own UCX fifo");
  if (local.own_segments.count({UcxComponent::kSysv, shmid})) return bad("sysv remote key names a segment of this rank");
  claim->component = UcxComponent::kSysv;
  claim->id = shmid;
  claim->peer_fifo = peer_fifo;
  claim->has_peer_fifo = peer_fifo <= INT32_MAX;
  return Status::Ok();
}

}  // namespace

Status check_peer_rkey(const LocalUcxLayout& local, const WorkerAddressLayout& peer, std::string_view rkey,
                       SegmentClaim* segment) {
  *segment = {};
  PackedRkeyLayout k;
  Status st = parse_packed_rkey(rkey, &k);
  if (!st.ok()) return {st.code(), "peer " + st.message()};
  if (k.mem_type >= 64 || !((local.memory_types >> k.mem_type) & 1))
    return bad("remote key of memory type " + std::to_string(k.mem_type) + ", which this rank's UCX does not support");
  for (const RkeyPart& p : k.parts) {
    const std::string md = "remote key part of md " + std::to_string(p.md_index);
    if (!(peer.md_map & (1ull << p.md_index))) return bad(md + ": the peer's worker address announces no such md");
    auto comps = local.md_components.find(p.md_index);
    if (comps == local.md_components.end() && !local.rkey_sizes.count(p.md_index))
      return bad(md + ": this rank's UCX has no such md");
    if (local.shm_only && comps != local.md_components.end())
      for (UcxComponent c : comps->second)
        if (!is_shm_component(c)) return bad(md + ": not a shared-memory transport (" + component_name(c) + ")");
    const size_t want = local.expected_rkey_size(p.md_index, peer);
    if (want == SIZE_MAX) return bad(md + ": no known layout");
    if (p.packed.size() != want)
      return bad(md + " of " + std::to_string(p.packed.size()) + " bytes, its component packs " + std::to_string(want));
    const UcxComponent c = single_component(local, p.md_index);
    if (c != UcxComponent::kSysv && c != UcxComponent::kPosix) continue;
    if (segment->component != UcxComponent::kUnknown) return bad("remote key names two shared-memory segments");
    st = c == UcxComponent::kSysv ? check_sysv_part(local, peer, p, segment) : check_posix_part(local, peer, p, segment);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

}  // namespace kvferry::ucx
