// The shard address envelope (src/transport/ucx/shard_address.cc): parse_shard_address() of any
// bytes never crashes; what it accepts holds 1..kMaxTransportShards non-empty addresses, and an
// envelope of two or more re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "kvferry/transport.h"
#include "transport/ucx/shard_address.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view address(reinterpret_cast<const char*>(data), size);
  auto r = kvferry::ucx::parse_shard_address(address);
  if (!r.ok()) return 0;
  FUZZ_CHECK(!r->empty() && r->size() <= kvferry::kMaxTransportShards);
  for (const auto& w : *r) FUZZ_CHECK(!w.empty());
  if (r->size() >= 2) FUZZ_CHECK(kvferry::ucx::encode_shard_address(*r) == address);
  return 0;
}
