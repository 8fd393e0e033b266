// `--memory host|cuda` of `kvferry replay` (docs/gpu.md, "The CLI"; `kvferry bench` takes
// host|engine|cuda, bench_command.cc, and refuses cuda with check_memory_kind). Device
// memory pools are not built yet (issue 32 items 6 and 9): `--memory cuda` is checked before
// anything starts and refused with the reason, the machine's first (no CUDA in this build, no
// usable GPU), else that the pools are not built. Header-only: cli/*_command.cc are the CLI's files.
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <ostream>
#include <string>

#include "device/device_copy.h"

namespace kvferry::cli {

// Adds --memory to `cmd`; the returned string holds its value once parsed ("host" by default).
inline std::shared_ptr<std::string> add_memory_option(CLI::App* cmd) {
  auto memory = std::make_shared<std::string>("host");
  cmd->add_option("--memory", *memory,
                  "where both engines' KV pools live: host, or cuda (GPU memory; not built yet: refused "
                  "with the reason, docs/gpu.md)")
      ->check(CLI::IsMember({"host", "cuda"}))
      ->capture_default_str();
  return memory;
}

// 0 when `memory` can be served; otherwise writes "kvferry <command>: --memory cuda: <why>" to
// `err` and returns 2 (a usage error: nothing was started).
inline int check_memory_kind(const std::string& command, const std::string& memory, std::ostream& err) {
  if (memory != "cuda") return 0;
  auto seam = device::open_cuda_device_copy();
  if (!seam.ok()) {
    err << "kvferry " << command << ": --memory cuda: no GPU to use: " << seam.status().message()
        << "\n";
    return 2;
  }
  err << "kvferry " << command
      << ": --memory cuda: device memory pools are not built yet (issue 32; docs/gpu.md); use --memory host\n";
  return 2;
}

}  // namespace kvferry::cli
