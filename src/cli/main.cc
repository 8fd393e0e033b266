// kvferry command-line entry point. Exceptions stop here: every subcommand returns an exit code.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvferry: KV-cache transfer for prefill/decode disaggregated LLM serving"};
  app.require_subcommand(1);
  kvferry::cli::add_replay_command(app);
  kvferry::cli::add_router_command(app);
  kvferry::cli::add_rank_command(app);
  kvferry::cli::add_bootstrap_command(app);
  kvferry::cli::add_logs_command(app);
  kvferry::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "kvferry: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
