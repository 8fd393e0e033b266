// The sharded worker address codec (format in shard_address.h).
#include "transport/ucx/shard_address.h"

#include <cstdint>

#include "kvferry/transport.h"

namespace kvferry::ucx {
namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t get_u32(std::string_view in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  return v;
}

Status malformed(const std::string& why) {
  return {ErrorCode::kProtocolError, "malformed sharded worker address: " + why};
}

}  // namespace

std::string encode_shard_address(const std::vector<std::string>& workers) {
  if (workers.size() == 1) return workers.front();
  std::string out(kShardAddressMagic);
  out.push_back(static_cast<char>(kShardAddressVersion));
  out.push_back(static_cast<char>(workers.size()));
  for (const std::string& w : workers) {
    put_u32(out, static_cast<uint32_t>(w.size()));
    out += w;
  }
  return out;
}

Result<std::vector<std::string>> parse_shard_address(std::string_view address) {
  if (address.empty()) return malformed("empty");
  if (!address.starts_with(kShardAddressMagic)) return std::vector<std::string>{std::string(address)};
  std::string_view rest = address.substr(kShardAddressMagic.size());
  if (rest.size() < 2) return malformed("truncated header");
  auto version = static_cast<uint8_t>(rest[0]);
  if (version != kShardAddressVersion) {
    return malformed("version " + std::to_string(version) + " (this build reads version " +
                     std::to_string(kShardAddressVersion) + ")");
  }
  auto count = static_cast<uint8_t>(rest[1]);
  if (count < 1 || count > kMaxTransportShards) {
    return malformed(std::to_string(count) + " shards (1.." +
                     std::to_string(kMaxTransportShards) + " allowed)");
  }
  rest.remove_prefix(2);
  std::vector<std::string> workers;
  workers.reserve(count);
  for (uint8_t i = 0; i < count; ++i) {
    if (rest.size() < 4) return malformed("shard " + std::to_string(i) + ": truncated length");
    uint32_t len = get_u32(rest);
    rest.remove_prefix(4);
    if (len == 0) return malformed("shard " + std::to_string(i) + ": empty address");
    if (len > rest.size()) {
      return malformed("shard " + std::to_string(i) + ": " + std::to_string(len) +
                       " bytes announced, " + std::to_string(rest.size()) + " left");
    }
    workers.emplace_back(rest.substr(0, len));
    rest.remove_prefix(len);
  }
  if (!rest.empty()) return malformed(std::to_string(rest.size()) + " trailing bytes");
  return workers;
}

}  // namespace kvferry::ucx
