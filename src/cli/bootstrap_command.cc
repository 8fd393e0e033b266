// `kvferry bootstrap`: the stand-alone bootstrap service, until SIGTERM or SIGINT.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <string.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/host_options.h"
#include "kvferry/bootstrap.h"
#include "kvferry/log.h"
#include "kvferry/port_file.h"

namespace kvferry::cli {
namespace {

struct BootstrapOptions {
  std::string bind_host = std::string(kDefaultHost);
  std::string advertise_host;
  uint16_t port = 0;
  std::string log_file;
  std::string port_file;
};

int run_bootstrap(const BootstrapOptions& o) {
  init_logging(LogConfig{.rank = "bootstrap", .json_path = o.log_file});
  // Block the stop signals before any thread starts, then wait for one of them here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  auto server = BootstrapServer::start(make_listen_address(o.bind_host, o.advertise_host, o.port));
  if (!server.ok()) {
    log_event(LogLevel::kError, "bootstrap", "cannot start: " + server.status().str());
    flush_logging();
    std::cerr << "kvferry bootstrap: " << server.status().str() << "\n";
    return 1;
  }
  std::cout << (*server)->port() << std::endl;
  if (!o.port_file.empty()) {
    if (Status st = write_port_file(o.port_file, (*server)->port()); !st.ok()) {
      std::cerr << "kvferry bootstrap: " << st.str() << "\n";
      return 1;
    }
  }
  log_event(LogLevel::kInfo, "bootstrap",
            "listening on " + host_port(o.bind_host, (*server)->port()) + ", clients use " + (*server)->address());
  int sig = 0;
  sigwait(&stop, &sig);
  log_event(LogLevel::kInfo, "bootstrap", std::string("stopping on ") + strsignal(sig));
  server->reset();
  flush_logging();
  return 0;
}

}  // namespace

void add_bootstrap_command(CLI::App& app) {
  auto o = std::make_shared<BootstrapOptions>();
  CLI::App* cmd = app.add_subcommand("bootstrap", "Run the bootstrap service until SIGTERM/SIGINT");
  add_host_options(cmd, &o->bind_host, &o->advertise_host, std::string(kDefaultHost));
  cmd->add_option("--host", o->bind_host, "the same as --bind-host (older name)")->check(host_check(true));
  cmd->add_option("--port", o->port, "port (0: any free port, printed)")->capture_default_str();
  cmd->add_option("--log-file", o->log_file, "JSON log file");
  cmd->add_option("--port-file", o->port_file, "write the bound port here once listening");
  cmd->callback([o] {
    const int rc = run_bootstrap(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
