#include "endpoint/span_compat.h"

namespace kvferry {

Result<std::vector<RegionSpan>> register_map(Transport& t, MemoryMap& map) {
  const std::vector<MapSpan>& spans = map.spans();
  if (spans.empty()) return Status(ErrorCode::kInvalidArgument, "no memory to register");
  if (map.transport_allocates()) {
    auto region = t.create_region(spans.front().bytes);
    if (!region.ok()) return region.status();
    map.bind_region(region->base);
    return std::vector<RegionSpan>{
        {0, region->bytes, reinterpret_cast<uint64_t>(region->base), region->packed_rkey}};
  }
  std::vector<MemorySpan> request;
  request.reserve(spans.size());
  for (const MapSpan& s : spans) request.push_back({s.base, s.bytes, s.offset, s.memory});
  auto regions = t.register_spans(request);
  if (!regions.ok()) return regions.status();
  std::vector<RegionSpan> out;
  out.reserve(regions->size());
  for (const LocalRegion& r : *regions)
    out.push_back({r.offset, r.bytes, reinterpret_cast<uint64_t>(r.base), r.packed_rkey});
  return out;
}

Result<RemoteRegionInfo> region_info(const std::string& worker_address, const std::vector<RegionSpan>& spans) {
  if (spans.empty()) return Status(ErrorCode::kProtocolError, "no span");
  RemoteRegionInfo info;
  info.worker_address = worker_address;
  info.spans.reserve(spans.size());
  for (const RegionSpan& s : spans) info.spans.push_back({s.offset, s.bytes, s.base, s.packed_rkey});
  return info;
}

}  // namespace kvferry
