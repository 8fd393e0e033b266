// Control frames (src/control/codec.cc, wire.cc): decode() of any bytes never crashes and never
// reads outside the input; a frame it accepts re-encodes to a frame that decodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "kvferry/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view frame(reinterpret_cast<const char*>(data), size);
  auto m = kvferry::decode(frame);
  if (!m.ok()) return 0;
  (void)kvferry::message_name(*m);
  std::string again = kvferry::encode(*m);
  auto m2 = kvferry::decode(again);
  FUZZ_CHECK(m2.ok());
  FUZZ_CHECK(kvferry::encode(*m2) == again);
  return 0;
}
