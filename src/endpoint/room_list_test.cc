// room_list (endpoint/room_list.h): the rooms a peer death failed, named in its warning line,
// bounded (issue 30, fix 5).
#include "endpoint/room_list.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

TEST(RoomList, NamesEveryRoomUpToTheBound) {
  EXPECT_EQ(room_list({}), "no rooms");
  EXPECT_EQ(room_list({7}), "room 7");
  EXPECT_EQ(room_list({7, 9, 12}), "rooms 7, 9, 12");
}

TEST(RoomList, NamesTheFirstRoomsThenCountsTheRest) {
  std::vector<uint64_t> rooms;
  for (uint64_t i = 1; i <= kMaxNamedRooms + 5; ++i) rooms.push_back(i);
  const std::string s = room_list(rooms);
  EXPECT_EQ(s.rfind("rooms 1, 2, 3,", 0), 0u) << s;
  EXPECT_NE(s.find(", 16 and 5 more"), std::string::npos) << s;
  EXPECT_EQ(s.find("17"), std::string::npos) << s;
}

}  // namespace
}  // namespace kvferry
