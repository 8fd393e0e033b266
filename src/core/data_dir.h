// Where kvferry finds the data it reads at run time (model geometry models.json, the bundled request
// traces under traces/), with or without the source tree it was built from (README "Install").
//
// The data directory is, in this order:
//   1. $KVFERRY_DATA_DIR, when set and not empty (taken as given, even if it lacks models.json, so
//      that a wrong setting shows up in the error naming the file);
//   2. <directory of the executable>/<bindir to datadir>/kvferry: an installed copy, e.g.
//      P/bin/kvferry reads P/share/kvferry (the relative path comes from the install directories
//      the build was configured with);
//   3. <directory of the executable>/share/kvferry: the build tree, where the build puts a copy of
//      data/ (build/kvferry reads build/share/kvferry);
// the first of 2 and 3 that holds models.json. When neither does, candidate 2 (so the error names
// where an install would have put it). An explicit option (`--models-file`) wins over all of them;
// callers apply it.
// Thread contract: pure functions of the environment and the file system; thread-safe.
#pragma once
#include <string>

namespace kvferry {

inline constexpr const char* kDataDirEnv = "KVFERRY_DATA_DIR";

// The rule above for an executable at `exe` (an absolute path) and an environment value `env`
// (nullptr: unset).
std::string data_dir_for(const std::string& exe, const char* env);
// The rule for the running process (/proc/self/exe, getenv(KVFERRY_DATA_DIR)).
std::string data_dir();
// data_dir() + "/models.json": the default of every --models-file.
std::string default_models_file();
// `path` itself when it names an existing file or has a directory part; otherwise
// data_dir()/traces/<path> when that exists (so `kvferry replay --trace conversation_trace.jsonl`
// runs a bundled trace from anywhere); otherwise `path` unchanged.
std::string resolve_trace_file(const std::string& path);

}  // namespace kvferry
