#include "device/ipc_handle.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "kvferry/buffers.h"

namespace kvferry::device {
namespace {

IpcHandle sample() {
  IpcHandle h;
  h.device = 3;
  h.bytes = 1 << 20;
  h.offset = 4096;
  for (size_t i = 0; i < h.payload.size(); ++i) h.payload[i] = static_cast<uint8_t>(i * 7 + 1);
  return h;
}

// The message of a refusal, or "accepted".
std::string why(const std::string& bytes) {
  auto r = parse_ipc_handle(bytes);
  if (r.ok()) return "accepted";
  EXPECT_EQ(r.status().code(), ErrorCode::kProtocolError);
  return r.status().message();
}

void put_u64(std::string& s, size_t at, uint64_t v) {
  for (size_t i = 0; i < 8; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

TEST(IpcHandle, RoundTrips) {
  const std::string bytes = encode_ipc_handle(sample());
  ASSERT_EQ(bytes.size(), kIpcHandleBytes);
  auto back = parse_ipc_handle(bytes);
  ASSERT_TRUE(back.ok()) << back.status().str();
  EXPECT_EQ(*back, sample());
}

TEST(IpcHandle, RefusesEveryShortOrLongInput) {
  const std::string good = encode_ipc_handle(sample());
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_NE(why(good.substr(0, n)).find("bytes, a handle has"), std::string::npos) << n;
  EXPECT_NE(why(good + '\0').find("97 bytes"), std::string::npos);
}

TEST(IpcHandle, RefusesEachBadField) {
  const std::string good = encode_ipc_handle(sample());
  auto edit = [&](size_t at, char v) {
    std::string s = good;
    s[at] = v;
    return why(s);
  };
  EXPECT_NE(edit(0, 'X').find("bad magic"), std::string::npos);
  EXPECT_NE(edit(4, 2).find("version 2"), std::string::npos);
  EXPECT_NE(edit(6, 2).find("unknown kind 2"), std::string::npos);  // fd handles: not built
  EXPECT_NE(edit(6, 0).find("unknown kind 0"), std::string::npos);
  EXPECT_NE(edit(7, 1).find("reserved"), std::string::npos);
  EXPECT_NE(edit(13, 1).find("reserved"), std::string::npos);
  EXPECT_NE(edit(11, static_cast<char>(0x80)).find("device -"), std::string::npos);
  EXPECT_NE(edit(8, static_cast<char>(kMaxCudaDevices)).find("outside [0, 64)"), std::string::npos);

  std::string s = good;
  put_u64(s, 16, 0);
  EXPECT_NE(why(s).find("zero bytes"), std::string::npos);
  put_u64(s, 16, kMaxIpcBufferBytes + 1);
  EXPECT_NE(why(s).find("more than"), std::string::npos);
  put_u64(s, 16, 4096);
  put_u64(s, 24, UINT64_MAX - 100);
  EXPECT_NE(why(s).find("offset"), std::string::npos);

  IpcHandle zero = sample();
  zero.payload.fill(0);
  EXPECT_NE(why(encode_ipc_handle(zero)).find("all-zero payload"), std::string::npos);
}

// Garbage never parses; a one-byte change of a real handle is refused or re-encodes to itself
// (the parser keeps nothing it did not check).
TEST(IpcHandle, GarbageAndMutations) {
  std::mt19937_64 rng(32);
  for (int i = 0; i < 20000; ++i) {
    std::string s(kIpcHandleBytes, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    if (i % 2 == 0) s.replace(0, 4, "KVIH");  // past the magic, the other fields must refuse it
    EXPECT_FALSE(parse_ipc_handle(s).ok()) << i;
  }
  const std::string good = encode_ipc_handle(sample());
  for (size_t at = 0; at < good.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string s = good;
      s[at] = static_cast<char>(s[at] ^ (1 << bit));
      auto r = parse_ipc_handle(s);
      if (r.ok()) {
        EXPECT_EQ(encode_ipc_handle(*r), s) << at << "/" << bit;
        EXPECT_GE(at, 8u) << "magic, version, kind and reserved bytes admit no change";
      }
    }
  }
}

}  // namespace
}  // namespace kvferry::device
