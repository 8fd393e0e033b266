// Worker address and rkey validation before any UCX call (src/transport/ucx/span_table.cc
// check_remote_info, as ucx_peers.cc calls it on a decoded pool registration): the control frame
// is decoded (src/control/codec.cc); a PoolRegistration's worker address goes through the shard
// envelope and its spans through check_remote_info, with and without rkeys (put and AM modes).
// Accepted spans are non-empty, non-overlapping and fit the address space.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>
#include <vector>

#include "fuzz_util.h"
#include "kvferry/messages.h"
#include "kvferry/transport.h"
#include "transport/ucx/shard_address.h"
#include "transport/ucx/span_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = kvferry::decode(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!m.ok()) return 0;
  const auto* reg = std::get_if<kvferry::PoolRegistration>(&*m);
  if (reg == nullptr) return 0;
  (void)kvferry::ucx::parse_shard_address(reg->worker_address);
  kvferry::RemoteRegionInfo info;
  info.worker_address = reg->worker_address;
  for (const auto& s : reg->spans) info.spans.push_back({s.offset, s.bytes, s.base, s.packed_rkey});
  for (bool need_rkeys : {false, true}) {
    std::vector<size_t> order;
    if (!kvferry::ucx::check_remote_info(info, need_rkeys, &order).ok()) continue;
    FUZZ_CHECK(order.size() == info.spans.size());
    for (size_t k = 0; k < order.size(); ++k) {
      const auto& s = info.spans[order[k]];
      FUZZ_CHECK(s.bytes > 0 && s.offset <= UINT64_MAX - s.bytes && s.base <= UINT64_MAX - s.bytes);
      if (need_rkeys) FUZZ_CHECK(!s.packed_rkey.empty());
      if (k > 0) {
        const auto& p = info.spans[order[k - 1]];
        FUZZ_CHECK(p.offset + p.bytes <= s.offset);
      }
    }
  }
  return 0;
}
