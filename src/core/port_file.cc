// Port files (kvferry/port_file.h).
#include "kvferry/port_file.h"

#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kvferry {
namespace {

std::optional<uint16_t> parse_port(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  uint32_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v == 0 || v > 65535) {
    return std::nullopt;
  }
  return static_cast<uint16_t>(v);
}

}  // namespace

Status write_port_file(const std::string& path, uint16_t port) {
  if (port == 0) return {ErrorCode::kInvalidArgument, "port file " + path + ": port 0 is not a bound port"};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << port << "\n";
    if (!out.flush()) return {ErrorCode::kInternal, "cannot write port file " + tmp};
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return {ErrorCode::kInternal, "cannot rename " + tmp + " to " + path};
  }
  return Status::Ok();
}

std::optional<uint16_t> read_port_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_port(ss.str());
}

std::optional<uint16_t> endpoint_port(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  return parse_port(std::string_view(endpoint).substr(colon + 1));
}

}  // namespace kvferry
