#include "logs/log_set.h"

#include <algorithm>
#include <charconv>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvferry::logs {
namespace {
namespace fs = std::filesystem;

bool digits(std::string_view s, size_t pos, size_t n, int* out) {
  if (pos + n > s.size()) return false;
  auto [end, ec] = std::from_chars(s.data() + pos, s.data() + pos + n, *out);
  return ec == std::errc() && end == s.data() + pos + n;
}

std::string str_field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
}  // namespace

std::optional<int64_t> parse_ts_us(std::string_view s) {
  // YYYY-MM-DDTHH:MM:SS[.ffffff]Z
  int y, mo, d, h, mi, sec;
  if (!digits(s, 0, 4, &y) || s.size() < 20 || s[4] != '-' || !digits(s, 5, 2, &mo) || s[7] != '-' ||
      !digits(s, 8, 2, &d) || s[10] != 'T' || !digits(s, 11, 2, &h) || s[13] != ':' || !digits(s, 14, 2, &mi) ||
      s[16] != ':' || !digits(s, 17, 2, &sec))
    return std::nullopt;
  size_t pos = 19;
  int64_t frac_us = 0;
  if (s[pos] == '.') {
    ++pos;
    int64_t scale = 100000;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
      frac_us += (s[pos] - '0') * scale;
      scale /= 10;
      ++pos;
    }
  }
  if (pos + 1 != s.size() || s[pos] != 'Z') return std::nullopt;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  return static_cast<int64_t>(timegm(&tm)) * 1'000'000 + frac_us;
}

void parse_log_text(std::string_view text, const std::string& file, LogSet& out) {
  size_t n = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++n;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("rank") || !j["rank"].is_string() ||
        !j.contains("msg") || !j["msg"].is_string()) {
      if (out.invalid_lines++ == 0) out.first_invalid = file + ":" + std::to_string(n);
      continue;
    }
    LogLine l;
    l.file = file;
    l.line_no = n;
    l.ts = str_field(j, "ts");
    l.ts_us = parse_ts_us(l.ts).value_or(0);
    l.level = str_field(j, "level");
    l.rank = str_field(j, "rank");
    l.component = str_field(j, "component");
    l.msg = str_field(j, "msg");
    const std::string room = str_field(j, "room");
    uint64_t r = 0;
    if (!room.empty()) {
      auto [end, ec] = std::from_chars(room.data(), room.data() + room.size(), r);
      if (ec == std::errc() && end == room.data() + room.size()) l.room = r;
    }
    l.code = str_field(j, "code");
    l.origin = str_field(j, "origin");
    l.reason = str_field(j, "reason");
    l.superseded_by = str_field(j, "superseded_by");
    l.via = str_field(j, "via");
    l.event = str_field(j, "event");
    l.peer = str_field(j, "peer");
    const std::string from = str_field(j, "is_from_another_rank");
    if (from == "true" || from == "false") l.is_from_another_rank = from == "true";
    out.lines.push_back(std::move(l));
  }
}

Result<LogSet> read_log_dir(const std::string& dir) {
  fs::path base(dir);
  std::error_code ec;
  if (fs::is_directory(base / "logs", ec)) base /= "logs";
  if (!fs::is_directory(base, ec)) return Status(ErrorCode::kInvalidArgument, dir + " is not a directory");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(base, ec))
    if (e.path().extension() == ".jsonl") files.push_back(e.path());
  if (ec) return Status(ErrorCode::kInvalidArgument, "cannot read " + base.string() + ": " + ec.message());
  if (files.empty()) return Status(ErrorCode::kInvalidArgument, "no *.jsonl log file in " + base.string());
  std::sort(files.begin(), files.end());
  LogSet set;
  for (const fs::path& p : files) {
    std::ifstream in(p, std::ios::binary);
    if (!in) return Status(ErrorCode::kInvalidArgument, "cannot read " + p.string());
    std::stringstream ss;
    ss << in.rdbuf();
    parse_log_text(ss.str(), p.filename().string(), set);
    ++set.files;
  }
  return set;
}

}  // namespace kvferry::logs
