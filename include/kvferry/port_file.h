// Port files: how a process that bound a listening socket to port 0 (the kernel picks a free
// port) tells the process that started it which port it got. This closes the race of picking a
// free port first and binding it later (another process may take it in between).
// File: the port in decimal and a newline, written to PATH.tmp and renamed to PATH, so a reader
// never sees a partial file.
// Thread contract: pure functions except the file access.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "kvferry/error.h"

namespace kvferry {

// Writes `port` (1..65535) to `path` atomically. kInvalidArgument for port 0, kInternal when the
// file cannot be written.
Status write_port_file(const std::string& path, uint16_t port);
// The port in `path`, or nullopt when the file does not exist (yet) or does not hold a port.
std::optional<uint16_t> read_port_file(const std::string& path);
// The port of a "tcp://HOST:PORT" endpoint (nullopt if it has none or it is 0).
std::optional<uint16_t> endpoint_port(const std::string& endpoint);

}  // namespace kvferry
