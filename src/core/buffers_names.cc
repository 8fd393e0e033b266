// Names of the buffer and memory kinds (kvferry/buffers.h). Kept apart from check_buffers
// (buffers.cc) so the transport, which needs only the names, does not depend on it.
#include "kvferry/buffers.h"

namespace kvferry {

std::string_view buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::kKv:
      return "kv";
    case BufferKind::kAux:
      return "aux";
    case BufferKind::kState:
      return "state";
  }
  return "unknown";
}

std::string_view memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

}  // namespace kvferry
