// Little-endian field writer/reader for control frames (used by codec.cc only).
//
// WireWriter appends fixed-width integers and u32-length-prefixed byte strings to a std::string.
// WireReader consumes the same from a string_view; it never reads past the end. Each read names
// its field; the first failing read records "<field>: <why>" and turns every later read into a
// no-op, so a decoder reads all fields and checks ok() once.
// Thread contract: plain values, one thread each.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvferry::wire {

class WireWriter {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void i64(int64_t v) { put(static_cast<uint64_t>(v), 8); }
  void bytes(std::string_view s);                 // u32 length + bytes
  void u64_array(const std::vector<uint64_t>& v); // u32 count + count * u64
  void raw(std::string_view s) { out_.append(s); }
  // Overwrites 4 bytes at `offset` (a length written before its contents were known).
  void patch_u32(size_t offset, uint32_t v);
  size_t size() const { return out_.size(); }
  std::string take() { return std::move(out_); }

 private:
  void put(uint64_t v, int n);
  std::string out_;
};

class WireReader {
 public:
  explicit WireReader(std::string_view in) : in_(in) {}

  bool u8(const char* field, uint8_t* v);
  bool u16(const char* field, uint16_t* v);
  bool u32(const char* field, uint32_t* v);
  bool u64(const char* field, uint64_t* v);
  bool i64(const char* field, int64_t* v);
  // A u32 length (at most max_len) followed by that many bytes.
  bool bytes(const char* field, uint32_t max_len, std::string* v);
  // A u32 count (at most max_count) followed by count u64 values.
  bool u64_array(const char* field, uint32_t max_count, std::vector<uint64_t>* v);
  // Records a semantic error (e.g. an out-of-range enum) unless one is already recorded.
  void fail(const char* field, const std::string& why);

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  bool take(const char* field, size_t n, uint64_t* v);
  std::string_view in_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace kvferry::wire
