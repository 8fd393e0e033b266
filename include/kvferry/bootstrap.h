// Bootstrap service (HTTP/JSON, cpp-httplib): prefill ranks register, decode ranks look them up.
//
// HTTP API (JSON bodies):
//   PUT  /route                 body: a PrefillRankInfo object          -> 200 {"ok":true}
//                               malformed/missing fields                 -> 400 {"error": "..."}
//   GET  /route?engine_id=E&dp_rank=D&tp_rank=R                         -> 200 PrefillRankInfo
//                               not registered (yet)                     -> 404 {"error": "..."}
//   GET  /route?engine_id=E&dp_rank=D                                   -> 200 [PrefillRankInfo...]
//                               a rank that left (DELETE below), until it registers again -> 410
//   DELETE /route?engine_id=E&dp_rank=D&tp_rank=R&incarnation=I: the rank leaves (Manager::leave)
//                               removed                                  -> 200 {"ok":true}
//                               not registered                           -> 404
//                               another incarnation registered, or an entry registered from its
//                               endpoint's own host and a DELETE from another address -> 400
//                               (nothing changes: a stale process cannot remove its successor)
//   GET  /health                                                        -> 200 {"ok":true,"ranks":N}
//   POST /failure, GET /failure?room=R: the failure board (src/bootstrap/failure_board.h): the rank
//                               that observed a room's failure posts it, a rank that learned of it
//                               only from its engine's agreement looks it up
//                               (docs/failure-model.md)
// Re-registering the same (engine_id, dp_rank, tp_rank) replaces the entry (a restarted rank); at
// most 16384 ranks are kept (400 beyond).
// The same port also serves SGLang's bootstrap routes (PUT/GET /route in SGLang's shape,
// POST /register_dp_rank, POST /query_dp_ranks; src/bootstrap/sglang_routes.h, docs/sglang.md).
// Thread contract: BootstrapServer runs its own threads; BootstrapClient is not thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvferry/compat.h"
#include "kvferry/error.h"
#include "kvferry/net.h"

namespace kvferry {

namespace security {
struct ClusterKeys;  // src/core/secret.h
}

struct PrefillRankInfo {
  uint32_t engine_id = 0;
  uint32_t dp_rank = 0;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  std::string host;              // the rank's advertised host (kvferry/net.h): a host name, IPv4 or
                                 // IPv6 address without brackets ("10.0.0.5", "fd00::5")
  std::string control_endpoint;  // ZeroMQ endpoint of the rank's ControlSocket, as advertised
                                 // ("tcp://host:port", IPv6 in brackets)
  uint32_t page_size = 0;        // tokens
  std::string dtype;             // "bfloat16"
  std::string model;             // geometry name
  uint32_t num_layers = 0;
  uint32_t heads_per_rank = 0;
  uint32_t first_head = 0;
  // The rank's incarnation (kvferry/messages.h): a rank restarted on the same control endpoint
  // registers a new one, which is how decode ranks tell it from its previous incarnation.
  // Optional in JSON ("incarnation", absent: 0, not known).
  uint64_t incarnation = 0;
  // The rank's transport address (Transport::address(), raw bytes; JSON: "transport_address",
  // standard base64, optional): a decode rank opens the connection to it before registering
  // (Transport::connect_reverse; docs/transport.md "TCP congestion control"). Empty: unknown.
  std::string transport_address;
  // The rank's compatibility fingerprint (kvferry/compat.h; JSON: "compat", an array of
  // [name, value] pairs, optional: absent is empty). A decode rank compares it with its own
  // before it uses any other field of the entry.
  Compat compat;
};

class BootstrapServer {
 public:
  // Starts listening on host:port (port 0 picks a free one). `host`: an IPv4 or IPv6 address
  // (brackets optional), a host name, or a wildcard ("0.0.0.0": IPv4; "::", "*", "": IPv6 and
  // IPv4). Errors: kInvalidArgument for a malformed host, kInternal if it cannot bind.
  static Result<std::unique_ptr<BootstrapServer>> start(const std::string& host, uint16_t port);
  // The same on address.bind_host and address.port; address() then gives the advertised one.
  static Result<std::unique_ptr<BootstrapServer>> start(const ListenAddress& address);
  // Both use the process's cluster keys (KVFERRY_SECRET_FILE / KVFERRY_SECRET, docs/security.md):
  // with a secret set, every request must carry a MAC of itself ("Authorization: KVF-MAC ...",
  // src/core/request_mac.h): a missing or malformed header or a timestamp more than 120 s off this
  // service's clock gets 401 before the body is read; a MAC that is not the request's (another key,
  // method, target, body, ts or nonce) or a nonce already accepted gets 401 before the route runs.
  // The bearer token is not accepted (only /metrics takes it). A bad secret file fails the start.
  // The same with explicit keys (nullptr: none), which must outlive the server:
  static Result<std::unique_ptr<BootstrapServer>> start(const ListenAddress& address,
                                                        const security::ClusterKeys* keys);
  ~BootstrapServer();  // stops and joins
  uint16_t port() const;
  // "host:port" clients use: the advertised host ("[v6]:port" for IPv6) and the bound port.
  std::string address() const;
  size_t registered() const;  // kvferry ranks plus SGLang-shaped ranks
  // A PUT of a kvferry rank replaces its entry only with the same or a newer incarnation (an older
  // one is refused: 400); each replacement by a different entry (endpoint or incarnation) is
  // counted here and logged (a warning at most every 10 s, with the count since the last).
  uint64_t overwrites() const;
  uint64_t refused_overwrites() const;
  // DELETE /route: entries removed, and DELETEs refused (nothing removed), so far.
  uint64_t deregistrations() const;
  uint64_t refused_deregistrations() const;
  // GET /route lookups of kvferry ranks answered so far (found, not yet registered, or left).
  uint64_t lookups() const;

 private:
  BootstrapServer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class BootstrapClient {
 public:
  // `address` is "host:port", "[v6]:port" or "http://host:port"; host an IPv4 or IPv6 address
  // or a host name (kvferry/net.h parse_host_port). A malformed address makes every call fail with
  // kInvalidArgument. Each call's connect, reads and writes are bounded by `timeout_ms`, and the
  // whole call by 3 x `timeout_ms` (then kPeerUnreachable "did not answer ... within"); an answer
  // longer than 4 MiB is kProtocolError, read no further.
  // With the process's cluster keys each request carries a MAC of that request alone, with the
  // current time and a fresh nonce (docs/security.md): the address may be one a request named, so
  // nothing it is sent authenticates any other request. A bad secret file makes every call fail
  // with its reason; a 401 is kInvalidArgument "not authorized" (another secret, or clocks more
  // than 120 s apart).
  BootstrapClient(std::string address, int timeout_ms = 2000);
  // The same with explicit keys (nullptr: no MAC), which must outlive the client.
  BootstrapClient(std::string address, int timeout_ms, const security::ClusterKeys* keys);
  ~BootstrapClient();
  Status register_rank(const PrefillRankInfo& info);
  // kPeerUnreachable: service not reachable; kInvalidArgument with "not registered": not yet there
  // (callers treat that as Bootstrapping and retry until their deadline); kPeerUnreachable with
  // "left:" (HTTP 410): the rank removed its entry (deregister()) and has not registered again,
  // which waiting will not change (callers stop at it).
  Result<PrefillRankInfo> lookup(uint32_t engine_id, uint32_t dp_rank, uint32_t tp_rank);
  Result<std::vector<PrefillRankInfo>> lookup_all(uint32_t engine_id, uint32_t dp_rank);
  Result<size_t> health();
  // Removes the rank's entry (DELETE /route): only the entry holding `incarnation` is removed.
  // Errors: kInvalidArgument "not registered" (nothing to remove), kInvalidArgument with the
  // service's reason (another incarnation is registered: the entry is kept), kPeerUnreachable.
  Status deregister(uint32_t engine_id, uint32_t dp_rank, uint32_t tp_rank, uint64_t incarnation);
  // The failure board: posts the record of a room's failure as this rank observed it (the board
  // keeps per room the record that wins by the root-cause rule).
  Status post_failure(uint64_t room, const Failure& f);
  // The room's record on the board; nullopt: nothing posted for the room (yet).
  Result<std::optional<Failure>> lookup_failure(uint64_t room);

 private:
  void init(std::string address, int timeout_ms, const security::ClusterKeys* keys);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvferry
