// The replay's output directory (orchestrator.h): reading and atomically writing its files, and
// clearing what a previous replay into the same directory left.
// Thread contract: plain functions on files.
#pragma once
#include <string>

#include "kvferry/error.h"
#include "replay/replay_config.h"

namespace kvferry::replay {

// The whole file; `ok` false when it cannot be opened.
std::string read_text_file(const std::string& path, bool& ok);
// Writes PATH.tmp, then renames it to PATH: a reader (a scraper reading metrics.json while the
// replay runs) never sees a partial file. A newline is appended.
Status write_file_atomic(const std::string& path, const std::string& text);
// Removes what a previous replay into `c.out` left (logs are counted by glob), and its report and
// results.
void clean_previous(const ReplayConfig& c);

}  // namespace kvferry::replay
