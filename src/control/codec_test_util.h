// What the control codec's tests share (codec_test.cc, codec_integrity_test.cc): a round trip
// that checks re-encoding gives the same frame, and helpers for hand-made corruptions.
// Thread contract: the test's thread.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <variant>

#include "kvferry/messages.h"

namespace kvferry::codec_testing {

template <typename T>
T round_trip(const T& m) {
  const std::string frame = encode(Message(m));
  auto r = decode(frame);
  EXPECT_TRUE(r.ok()) << r.status().str();
  if (!r.ok()) return T{};
  EXPECT_TRUE(std::holds_alternative<T>(*r));
  EXPECT_EQ(encode(*r), frame);
  return std::get<T>(*r);
}

// Writes `v` as `n` little-endian bytes at `off`.
inline void put_le(std::string& f, size_t off, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) f[off + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
// The header's body_length after the frame was cut or grown.
inline void fix_body_length(std::string& f) { put_le(f, 8, f.size() - 12, 4); }

inline void expect_rejected(const std::string& frame, const std::string& mentions) {
  auto r = decode(frame);
  ASSERT_FALSE(r.ok()) << "accepted a bad frame; expected error mentioning " << mentions;
  EXPECT_EQ(r.status().code(), ErrorCode::kProtocolError);
  EXPECT_NE(r.status().message().find(mentions), std::string::npos) << r.status().message();
}

}  // namespace kvferry::codec_testing
