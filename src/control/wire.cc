#include "control/wire.h"

namespace kvferry::wire {

void WireWriter::put(uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void WireWriter::bytes(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  out_.append(s);
}

void WireWriter::u64_array(const std::vector<uint64_t>& v) {
  u32(static_cast<uint32_t>(v.size()));
  out_.reserve(out_.size() + v.size() * 8);
  for (uint64_t x : v) u64(x);
}

void WireWriter::patch_u32(size_t offset, uint32_t v) {
  for (int i = 0; i < 4; ++i) out_[offset + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

void WireReader::fail(const char* field, const std::string& why) {
  if (error_.empty()) error_ = std::string(field) + ": " + why;
}

bool WireReader::take(const char* field, size_t n, uint64_t* v) {
  if (!ok()) return false;
  if (remaining() < n) {
    fail(field, "truncated (needs " + std::to_string(n) + " bytes, " +
                    std::to_string(remaining()) + " left)");
    return false;
  }
  uint64_t x = 0;
  for (size_t i = 0; i < n; ++i) {
    x |= static_cast<uint64_t>(static_cast<uint8_t>(in_[pos_ + i])) << (8 * i);
  }
  pos_ += n;
  *v = x;
  return true;
}

bool WireReader::u8(const char* field, uint8_t* v) {
  uint64_t x = 0;
  if (!take(field, 1, &x)) return false;
  *v = static_cast<uint8_t>(x);
  return true;
}

bool WireReader::u16(const char* field, uint16_t* v) {
  uint64_t x = 0;
  if (!take(field, 2, &x)) return false;
  *v = static_cast<uint16_t>(x);
  return true;
}

bool WireReader::u32(const char* field, uint32_t* v) {
  uint64_t x = 0;
  if (!take(field, 4, &x)) return false;
  *v = static_cast<uint32_t>(x);
  return true;
}

bool WireReader::u64(const char* field, uint64_t* v) { return take(field, 8, v); }

bool WireReader::i64(const char* field, int64_t* v) {
  uint64_t x = 0;
  if (!take(field, 8, &x)) return false;
  *v = static_cast<int64_t>(x);
  return true;
}

bool WireReader::bytes(const char* field, uint32_t max_len, std::string* v) {
  uint32_t len = 0;
  if (!u32(field, &len)) return false;
  if (len > max_len) {
    fail(field, "length " + std::to_string(len) + " exceeds the limit " + std::to_string(max_len));
    return false;
  }
  if (len > remaining()) {
    fail(field, "length " + std::to_string(len) + " runs past the end of the body (" +
                    std::to_string(remaining()) + " bytes left)");
    return false;
  }
  v->assign(in_.data() + pos_, len);
  pos_ += len;
  return true;
}

bool WireReader::u64_array(const char* field, uint32_t max_count, std::vector<uint64_t>* v) {
  uint32_t count = 0;
  if (!u32(field, &count)) return false;
  if (count > max_count) {
    fail(field, "count " + std::to_string(count) + " exceeds the limit " +
                    std::to_string(max_count));
    return false;
  }
  if (static_cast<uint64_t>(count) * 8 > remaining()) {
    fail(field, "count " + std::to_string(count) + " runs past the end of the body (" +
                    std::to_string(remaining()) + " bytes left)");
    return false;
  }
  v->resize(count);
  for (uint32_t i = 0; i < count; ++i) take(field, 8, &(*v)[i]);
  return true;
}

}  // namespace kvferry::wire
