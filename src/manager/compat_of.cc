#include "manager/compat_of.h"

#include <fmt/format.h>

#include "device/device_copy.h"
#include "kvferry/messages.h"
#include "transport/ucx/ucx_config.h"

namespace kvferry {

Compat compat_of(const ManagerConfig& c, const MemoryShape& shape, uint32_t prefill_tp, uint32_t decode_tp) {
  bool host = c.buffers.empty();  // kvferry's own pool, or an engine pool, is host memory
  bool cuda = false;
  for (const BufferDesc& b : c.buffers) {
    if (b.kind != BufferKind::kKv) continue;
    (b.memory == MemoryKind::kCuda ? cuda : host) = true;
  }
  const std::string kv_memory = host && cuda ? "host+cuda" : cuda ? "cuda" : "host";
  const ModelGeometry& m = c.model;
  return Compat{
      {"version", kKvferryVersion},
      {"min_peer_version", kMinPeerVersion},
      {"wire", std::to_string(kProtocolVersion)},
      {"model", m.name},
      {"attention", m.attention},
      {"layers", std::to_string(m.num_layers)},
      {"kv_heads", std::to_string(m.cache_heads)},
      {"head_dim", std::to_string(m.head_dim)},
      {"dtype_bytes", std::to_string(m.dtype_bytes)},
      {"page_size", std::to_string(c.page_size)},
      {"layout", fmt::format("kv_buffers={} aux=[{}] state=[{}]", shape.kv_offsets.size(),
                             fmt::join(shape.aux_item_bytes, ","), fmt::join(shape.state_item_bytes, ","))},
      {"kv_memory", kv_memory},
      {"memory_support", device::built_with_cuda() ? "host+cuda" : "host"},
      {"tp", fmt::format("prefill {} decode {}", prefill_tp, decode_tp)},
      // Both ends of a shm connection must size UCX's fragments alike (ucx_config.h kShmSegSize:
      // UCX's worker address does not carry it, and a larger writer crashes the receiver).
      {"transport", c.transport == "shm" ? fmt::format("shm seg {}", ucx::kShmSegSize) : c.transport},
  };
}

}  // namespace kvferry
