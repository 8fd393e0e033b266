// The rooms a peer's death failed, for its one warning line (docs/failure-model.md "Peer death"):
// the first kMaxNamedRooms room ids in order, then how many more, so the line names the failed
// requests and stays bounded.
#pragma once
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvferry {

inline constexpr size_t kMaxNamedRooms = 16;

// "rooms 7, 9, 12" / "rooms 1, 2, ..., 16 and 5 more" / "no rooms".
inline std::string room_list(const std::vector<uint64_t>& rooms, size_t max_named = kMaxNamedRooms) {
  if (rooms.empty()) return "no rooms";
  std::string out = rooms.size() == 1 ? "room " : "rooms ";
  for (size_t i = 0; i < rooms.size() && i < max_named; ++i) out += (i ? ", " : "") + std::to_string(rooms[i]);
  if (rooms.size() > max_named) out += fmt::format(" and {} more", rooms.size() - max_named);
  return out;
}

}  // namespace kvferry
