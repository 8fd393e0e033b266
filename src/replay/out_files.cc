// The replay's output directory (out_files.h).
#include "replay/out_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "replay/child_args.h"

namespace kvferry::replay {
namespace fs = std::filesystem;

std::string read_text_file(const std::string& path, bool& ok) {
  std::ifstream in(path, std::ios::binary);
  ok = static_cast<bool>(in);
  std::stringstream ss;
  if (ok) ss << in.rdbuf();
  return ss.str();
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return {ErrorCode::kInternal, "cannot write " + tmp};
    out << text << "\n";
    if (!out.flush()) return {ErrorCode::kInternal, "cannot write " + tmp};
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return {ErrorCode::kInternal, "cannot rename " + tmp + " to " + path + ": " + ec.message()};
  return Status::Ok();
}

void clean_previous(const ReplayConfig& c) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(logs_dir(c), ec)) {
    const auto ext = e.path().extension();
    if (ext == ".jsonl" || ext == ".stderr" || ext == ".killed-tail" || ext == ".port" || ext == ".tmp") {
      fs::remove(e.path(), ec);
    }
  }
  fs::remove(c.out + "/report.json", ec);
  fs::remove(c.out + "/results.json", ec);
  fs::remove(c.out + "/results.json.progress", ec);
}

}  // namespace kvferry::replay
