// kvferry command-line entry point. Exceptions stop here: every subcommand returns an exit code.
#include <CLI/CLI.hpp>
#include <stdlib.h>

#include <exception>
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "core/secret.h"

namespace {

// --secret-file PATH on every command that talks to a cluster (docs/security.md): it becomes
// KVFERRY_SECRET_FILE (absolute) for this process and, by inheritance, every process it starts; a
// path is all that is passed on, never the secret. Checked here, so a bad file stops the command
// at once.
void add_secret_file_option(CLI::App& cmd) {
  cmd.add_option_function<std::string>(
         "--secret-file",
         [](const std::string& path) {
           std::error_code ec;
           const std::string abs = std::filesystem::absolute(path, ec).string();
           ::setenv(kvferry::security::kSecretFileEnv, ec ? path.c_str() : abs.c_str(), 1);
           auto keys = kvferry::security::cluster_keys();
           if (!keys.ok()) throw CLI::ValidationError("--secret-file", keys.status().message());
         },
         "the cluster's shared secret: CURVE on every ZeroMQ socket, a MAC of each request to the bootstrap "
         "service, a bearer token on the metrics endpoints (sets KVFERRY_SECRET_FILE for this process and its children; the file must "
         "not be readable by group or others; docs/security.md)")
      ->type_name("PATH");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvferry: KV-cache transfer for prefill/decode disaggregated LLM serving"};
  app.require_subcommand(1);
  kvferry::cli::add_replay_command(app);
  kvferry::cli::add_router_command(app);
  kvferry::cli::add_rank_command(app);
  kvferry::cli::add_bootstrap_command(app);
  kvferry::cli::add_logs_command(app);
  kvferry::cli::add_bench_command(app);
  for (CLI::App* cmd : app.get_subcommands([](CLI::App* c) { return c->get_name() != "logs"; }))
    add_secret_file_option(*cmd);
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
