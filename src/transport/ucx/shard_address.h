// The worker address of a sharded transport: every shard's ucp worker address in one string, so a
// peer can connect each of its shards to one of ours.
//
// Format (version 1), all integers little-endian:
//   "KVFSHRD" (7 bytes) | version u8 = 1 | count u8 (1..kMaxTransportShards) |
//   count x { length u32 (> 0) | that many bytes of ucp worker address }
// and nothing after. A string that does not start with the 7-byte magic is a plain ucp worker
// address (a transport with one shard publishes exactly that, so shards = 1 is wire-compatible
// with transports that predate sharding).
//
// Thread contract: pure functions.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::ucx {

inline constexpr std::string_view kShardAddressMagic = "KVFSHRD";
inline constexpr uint8_t kShardAddressVersion = 1;

// One worker address: returned as is. More: the format above. `workers` must hold 1 to
// kMaxTransportShards non-empty addresses, each shorter than 4 GiB.
std::string encode_shard_address(const std::vector<std::string>& workers);

// The shard worker addresses (at least one, each non-empty). Errors: kProtocolError naming what
// is wrong (empty, unknown version, bad count, truncated entry, empty entry, trailing bytes).
Result<std::vector<std::string>> parse_shard_address(std::string_view address);

}  // namespace kvferry::ucx
