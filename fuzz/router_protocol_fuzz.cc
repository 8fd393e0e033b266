// The router protocol as the router decodes it (src/replay/router.cc): engine frames
// (src/driver/engine_protocol.cc decode_router_frame) and peer-death frames
// (src/replay/peer_death_frames.cc). Neither crashes or throws on any text; an accepted frame
// re-encodes (where an encoder exists) to one that decodes again.
#include <cstddef>
#include <cstdint>
#include <string>

#include "driver/engine_protocol.h"
#include "fuzz_util.h"
#include "replay/peer_death_frames.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto f = kvferry::decode_router_frame(text);
  if (f.ok() && f->result) FUZZ_CHECK(kvferry::decode_router_frame(kvferry::encode_result(*f->result)).ok());
  if (f.ok() && f->type == "abort") FUZZ_CHECK(kvferry::decode_router_frame(kvferry::encode_abort(f->abort_room)).ok());
  auto pd = kvferry::replay::decode_peer_death_frame(text);
  if (pd.ok() && pd->has_value()) {
    const auto& p = **pd;
    auto again = kvferry::replay::decode_peer_death_frame(
        kvferry::replay::encode_peer_death(p.type, p.rank, p.time_ns, p.reason));
    FUZZ_CHECK(again.ok() && again->has_value());
  }
  return 0;
}
