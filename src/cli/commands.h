// Subcommands of the `kvferry` CLI. Each file src/cli/<name>_command.cc adds one.
#pragma once
namespace CLI { class App; }

namespace kvferry::cli {
void add_replay_command(CLI::App& app);     // replay_command.cc: the main job (orchestrator)
void add_router_command(CLI::App& app);     // router_command.cc: internal, spawned by replay
void add_rank_command(CLI::App& app);       // rank_command.cc: internal, one engine rank
void add_bootstrap_command(CLI::App& app);  // bootstrap_command.cc: stand-alone bootstrap service
void add_logs_command(CLI::App& app);       // logs_command.cc: root causes from a run's logs
void add_bench_command(CLI::App& app);      // bench_command.cc: transfer benchmark (+ internal bench-rank)
}  // namespace kvferry::cli
