// One engine rank as a process: builds the rank's Manager (kvferry/manager.h: pool, transport,
// control socket, bootstrap), and runs the engine loop until the router's shutdown.
// Thread contract: run_rank() on the process's main thread; returns the exit code
// (0 clean shutdown, 2 could not start, 3 a peer of the engine stopped answering, 128+N stopped by
// signal N: SIGTERM/SIGINT end the loop after its step, logs and metrics file are still written).
#pragma once
#include <cstdint>
#include <string>

#include "kvferry/deadlines.h"
#include "kvferry/error.h"
#include "kvferry/transport.h"

namespace kvferry {

struct RankOptions {
  Role role = Role::kPrefill;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint32_t peer_tp_size = 0;     // the other engine's TP size (0: same as tp_size)
  uint32_t dp_rank = 0;          // this rank's DP group (each DP group is its own TP engine)
  uint32_t peer_dp_size = 1;
  // The engine's instance in an xPyD replay (ready and stats frames). A decode rank's engine_id is
  // its instance (prefill serves several decode instances by engine_id); prefill ranks stay
  // engine 0 (each prefill instance has its own bootstrap service).
  uint32_t instance = 0;     // the other engine's DP size (rooms go to DP rank dp_rank_for_room(), kvferry/routing.h)
  std::string model = "Llama-3.1-8B";
  std::string models_file;       // data/models.json
  uint32_t page_size = 64;       // tokens
  uint64_t pool_mib = 1024;      // this rank's pool, MiB
  uint32_t aux_slots = 1024;
  uint64_t chunk_tokens = 8192;  // prefill: tokens per send()
  double prefill_ms_per_layer = 0;  // prefill: the compute model (driver/prefill_driver.h)
  bool layerwise = false;           // prefill: send each layer as its compute ends
  std::string bootstrap = "127.0.0.1:8998";
  std::string engine_endpoint;   // the engine leader's endpoint
  std::string router_endpoint;
  std::string transport = "shm";  // a registered transport name (kvferry/transport.h)
  uint32_t transfer_shards = 1;  // transfer worker shards (TransportOptions::shards)
  bool integrity = false;        // ManagerConfig::integrity
  std::string log_file;
  uint16_t metrics_port = 0;     // serve Prometheus metrics on bind_host:port (0: none, or any free
                                 // port when metrics_port_file is set)
  std::string metrics_port_file; // serve metrics and write their bound port here (kvferry/port_file.h)
  std::string metrics_file;      // write the final metrics here at exit (empty: none)
  std::string port_file;         // the engine socket's bound port goes here (port_file.h): the
                                 // leader's engine endpoint, a follower's own engine socket
  uint16_t engine_port = 0;      // follower: bind its engine socket on this port (0: any free port)
  uint16_t control_port = 0;     // the control socket's port (0: any free port)
  std::string control_port_file; // the control socket's bound port goes here (port_file.h)
  Deadlines deadlines;
  // Where the rank's sockets listen (control, heartbeat, engine agreement, metrics) and the host
  // peers are told (kvferry/net.h). Empty: not given; bind_host is then kDefaultHost (the engine
  // leader's socket: its engine_endpoint's host) and advertise_host follows the bind host.
  std::string bind_host;
  std::string advertise_host;
};

int run_rank(const RankOptions& options);

}  // namespace kvferry
