// Log validation and per-room line counts (log_scan.h).
#include "replay/log_scan.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kvferry::replay {
namespace {

using json = nlohmann::ordered_json;

bool known_level(const std::string& l) {
  return l == "trace" || l == "debug" || l == "info" || l == "warning" || l == "error" ||
         l == "critical";
}

}  // namespace

void scan_log_text(std::string_view text, const std::string& file, LogScan& scan) {
  size_t pos = 0;
  uint64_t line_no = 0;
  auto invalid = [&](const std::string& why) {
    ++scan.invalid_lines;
    if (scan.first_invalid.empty()) {
      scan.first_invalid = fmt::format("{}:{}: {}", file, line_no, why);
    }
  };
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty()) continue;
    ++scan.lines;
    const json o = json::parse(line, nullptr, false);
    if (o.is_discarded() || !o.is_object()) {
      invalid("not a JSON object");
      continue;
    }
    bool ok = true;
    for (const char* key : {"ts", "level", "rank", "msg"}) {
      auto it = o.find(key);
      if (it == o.end() || !it->is_string()) {
        invalid(std::string("missing string field '") + key + "'");
        ok = false;
        break;
      }
    }
    if (!ok) continue;
    const std::string level = o["level"].get<std::string>();
    if (!known_level(level)) {
      invalid("unknown level '" + level + "'");
      continue;
    }
    if (auto ev = o.find("event"); ev != o.end() && ev->is_string() && *ev == "peer_dead") {
      LogScan::PeerDead d;
      d.rank = o["rank"].get<std::string>();
      if (auto peer = o.find("peer"); peer != o.end() && peer->is_string()) d.peer = peer->get<std::string>();
      if (auto m = o.find("mono_ns"); m != o.end() && m->is_number_integer()) d.mono_ns = m->get<int64_t>();
      d.above_debug = level != "trace" && level != "debug";
      d.msg = o["msg"].get<std::string>();
      scan.peer_dead.push_back(std::move(d));
    }
    if (auto ev = o.find("event"); ev != o.end() && ev->is_string() && *ev == "stale_refused") {
      LogScan::StaleRefused s;
      s.rank = o["rank"].get<std::string>();
      if (auto peer = o.find("peer"); peer != o.end() && peer->is_string()) s.peer = peer->get<std::string>();
      if (auto kind = o.find("kind"); kind != o.end() && kind->is_string()) s.kind = kind->get<std::string>();
      if (auto m = o.find("mono_ns"); m != o.end() && m->is_number_integer()) s.mono_ns = m->get<int64_t>();
      scan.stale_refused.push_back(std::move(s));
    }
    auto room = o.find("room");
    if (room == o.end() || room->is_null()) continue;
    std::string room_str;
    if (room->is_string()) {
      room_str = room->get<std::string>();
    } else if (room->is_number_unsigned()) {
      room_str = std::to_string(room->get<uint64_t>());
      invalid("room is a number, not a decimal string");
    } else {
      invalid("room is neither a string nor a number");
      continue;
    }
    if (level != "trace" && level != "debug") ++scan.above_debug_by_room[room_str];
  }
}

LogScan scan_log_files(const std::string& dir) {
  LogScan scan;
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".jsonl") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    ++scan.files;
    scan_log_text(ss.str(), p.filename().string(), scan);
  }
  return scan;
}

}  // namespace kvferry::replay
