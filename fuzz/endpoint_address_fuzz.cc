// Addresses a peer announces (a PoolRegistration's control_endpoint, a bootstrap entry's host and
// control_endpoint), as the control socket and bootstrap parse them before connecting
// (src/core/net.cc parse_host_port, parse_host). Never a crash; an accepted endpoint (not a wildcard) re-formats
// to one that parses to the same host and port.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "kvferry/net.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)kvferry::parse_host(text, /*allow_wildcard=*/false);
  (void)kvferry::parse_host(text, /*allow_wildcard=*/true);
  auto hp = kvferry::parse_host_port(text);
  if (!hp.ok()) return 0;
  if (kvferry::is_wildcard_host(hp->host)) return 0;  // "" and "*" both format as ZeroMQ's "*"
  auto again = kvferry::parse_host_port(kvferry::zmq_endpoint(hp->host, hp->port));
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->host == hp->host && again->port == hp->port);
  return 0;
}
