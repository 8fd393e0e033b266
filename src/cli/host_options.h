// --bind-host / --advertise-host for the commands that listen (rank, bootstrap, router): the same
// names, help and checks everywhere (kvferry/net.h, docs/network.md).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "kvferry/net.h"

namespace kvferry::cli {

// A CLI11 check: a host (IPv4, [IPv6] or IPv6, host name; wildcards only when allowed).
inline CLI::Validator host_check(bool allow_wildcard) {
  return CLI::Validator(
      [allow_wildcard](std::string& value) -> std::string {
        auto h = parse_host(value, allow_wildcard);
        if (!h.ok()) return h.status().message();
        value = *h;  // brackets removed
        return "";
      },
      "HOST");
}

// Adds both options. `bind_default` and `advertise_default` say in --help what an absent option means.
inline void add_host_options(CLI::App* cmd, std::string* bind_host, std::string* advertise_host,
                             const std::string& bind_default,
                             const std::string& advertise_default =
                                 "the bind host; for a wildcard bind, this machine's host name") {
  cmd->add_option("--bind-host", *bind_host,
                  "listen on this host: an IPv4 or IPv6 address, a host name, or 0.0.0.0 / :: / * for every "
                  "interface (default: " + bind_default + ")")
      ->check(host_check(true));
  cmd->add_option("--advertise-host", *advertise_host,
                  "the host peers are told to connect to: a host name, IPv4 or IPv6 address, not a wildcard "
                  "(default: " + advertise_default + ")")
      ->check(host_check(false));
}

}  // namespace kvferry::cli
