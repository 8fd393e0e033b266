// The engine agreement codec (src/driver/sync_codec.cc, with the failure records of
// src/core/failure_json.cc): decode_sync_frame() of any text never crashes or throws.
#include <cstddef>
#include <cstdint>
#include <string>

#include "driver/sync_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  (void)kvferry::decode_sync_frame(text);
  return 0;
}
