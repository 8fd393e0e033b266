// The data directory rule (core/data_dir.h).
#include "core/data_dir.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

// Relative path from the install's bindir to its datadir/kvferry (src/CMakeLists.txt sets it from
// GNUInstallDirs); the default matches the default install layout.
#ifndef KVFERRY_BIN_TO_DATA
#define KVFERRY_BIN_TO_DATA "../share/kvferry"
#endif

namespace kvferry {
namespace {

namespace fs = std::filesystem;

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

std::string self_exe_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

std::string data_dir_for(const std::string& exe, const char* env) {
  if (env != nullptr && *env != '\0') return env;
  const fs::path dir = fs::path(exe).parent_path();
  const fs::path installed = (dir / KVFERRY_BIN_TO_DATA).lexically_normal();
  const fs::path build_tree = (dir / "share" / "kvferry").lexically_normal();
  if (!is_file(installed / "models.json") && is_file(build_tree / "models.json")) return build_tree.string();
  return installed.string();
}

std::string data_dir() { return data_dir_for(self_exe_path(), std::getenv(kDataDirEnv)); }

std::string default_models_file() { return (fs::path(data_dir()) / "models.json").string(); }

std::string resolve_trace_file(const std::string& path) {
  const fs::path p(path);
  if (path.empty() || is_file(p) || p.has_parent_path()) return path;
  const fs::path bundled = fs::path(data_dir()) / "traces" / p;
  return is_file(bundled) ? bundled.string() : path;
}

}  // namespace kvferry
