#include "endpoint/span_compat.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvferry {

Result<std::vector<RegionSpan>> register_map(Transport& t, MemoryMap& map) {
  const std::vector<MapSpan>& spans = map.spans();
  if (spans.empty()) return Status(ErrorCode::kInvalidArgument, "no memory to register");
  for (const MapSpan& s : spans)
    if (s.memory != MemoryKind::kHost)
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("a {} buffer needs a transport with UCX {} support (register_spans); this build "
                                "registers host memory only",
                                memory_kind_name(s.memory), memory_kind_name(s.memory)));
  if (map.transport_allocates()) {
    auto region = t.create_region(spans.front().bytes);
    if (!region.ok()) return region.status();
    map.bind_region(region->base);
    return std::vector<RegionSpan>{
        {0, region->bytes, reinterpret_cast<uint64_t>(region->base), region->packed_rkey}};
  }
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const MapSpan& s : spans) {
    lo = std::min(lo, reinterpret_cast<uint64_t>(s.base));
    hi = std::max(hi, reinterpret_cast<uint64_t>(s.base) + s.bytes);
  }
  for (const MapSpan& s : spans)
    if (reinterpret_cast<uint64_t>(s.base) - lo != s.offset)
      return Status(ErrorCode::kInternal, "memory map offsets do not mirror the address layout");
  auto region = t.register_region(reinterpret_cast<uint8_t*>(lo), hi - lo);
  if (!region.ok()) return region.status();
  std::vector<RegionSpan> out;
  for (const MapSpan& s : spans)
    out.push_back({s.offset, s.bytes, reinterpret_cast<uint64_t>(s.base), region->packed_rkey});
  return out;
}

Result<RemoteRegionInfo> region_info(const std::string& worker_address, const std::vector<RegionSpan>& spans) {
  if (spans.empty()) return Status(ErrorCode::kProtocolError, "no span");
  RemoteRegionInfo info;
  info.worker_address = worker_address;
  info.packed_rkey = spans.front().packed_rkey;
  const RegionSpan& f = spans.front();
  if (f.base < f.offset) return Status(ErrorCode::kProtocolError, "span base below its offset");
  info.base = f.base - f.offset;
  uint64_t end = 0;
  for (const RegionSpan& s : spans) {
    if (s.packed_rkey != info.packed_rkey || s.base < s.offset || s.base - s.offset != info.base)
      return Status(ErrorCode::kProtocolError,
                    "spans that are not one region need a transport with register_spans");
    end = std::max(end, s.offset + s.bytes);  // decode() checked offset + bytes does not overflow
  }
  info.bytes = end;
  return info;
}

}  // namespace kvferry
