// /proc/meminfo fields (host_memory.h).
#include "process/host_memory.h"

#include <fstream>

namespace kvferry::process {

uint64_t meminfo_bytes(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == field + ":") return kb * 1024;
  }
  return 0;
}

uint64_t mem_available_bytes() { return meminfo_bytes("MemAvailable"); }

}  // namespace kvferry::process
