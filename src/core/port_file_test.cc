#include "kvferry/port_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace kvferry {
namespace {

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string(name) + std::to_string(::getpid()))).string();
}

TEST(PortFile, WritesAndReadsBack) {
  const std::string p = temp_path("kvferry-port-");
  std::filesystem::remove(p);
  EXPECT_FALSE(read_port_file(p).has_value());  // not there yet
  ASSERT_TRUE(write_port_file(p, 41234).ok());
  EXPECT_EQ(read_port_file(p), 41234);
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
  ASSERT_TRUE(write_port_file(p, 80).ok());  // replaces
  EXPECT_EQ(read_port_file(p), 80);
  std::filesystem::remove(p);
}

TEST(PortFile, RejectsPortZeroAndGarbage) {
  const std::string p = temp_path("kvferry-port-bad-");
  EXPECT_EQ(write_port_file(p, 0).code(), ErrorCode::kInvalidArgument);
  for (const char* text : {"", "abc\n", "70000\n", "0\n", "12x\n"}) {
    std::ofstream(p) << text;
    EXPECT_FALSE(read_port_file(p).has_value()) << text;
  }
  std::filesystem::remove(p);
}

TEST(PortFile, EndpointPort) {
  EXPECT_EQ(endpoint_port("tcp://127.0.0.1:5555"), 5555);
  EXPECT_FALSE(endpoint_port("tcp://127.0.0.1:0").has_value());
  EXPECT_FALSE(endpoint_port("tcp://127.0.0.1").has_value());
  EXPECT_FALSE(endpoint_port("inproc://x").has_value());
}

}  // namespace
}  // namespace kvferry
