// Authentication of kvferry's cpp-httplib servers (docs/security.md). Header-only so that only
// components that link cpp-httplib (bootstrap, metrics) see httplib.
// With cluster keys (core/secret.h):
// - /metrics (require_bearer): a request whose Authorization header is not "Bearer <token>"
//   (constant-time compare) gets 401 in the pre-routing handler, before a route runs;
// - the bootstrap service (require_request_mac, check_request_mac): each request carries a MAC of
//   itself (core/request_mac.h). What needs no body (the header's syntax, its timestamp) is checked
//   in the pre-routing handler, before the body is read; the MAC and the nonce by each route's
//   wrapper, once the body (bounded by the server's payload limit) is read, before the route runs.
//   A bearer token is refused there like any other header.
// A refused request gets 401 and its connection is closed. Without keys nothing is required.
#pragma once
#include <httplib.h>

#include <string>

#include "core/request_mac.h"
#include "core/secret.h"

namespace kvferry::security {

inline void require_bearer(httplib::Server& server, const ClusterKeys* keys) {
  if (!keys) return;
  server.set_pre_routing_handler([keys](const httplib::Request& req, httplib::Response& res) {
    if (bearer_matches(*keys, req.get_header_value("Authorization")))
      return httplib::Server::HandlerResponse::Unhandled;
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer realm=\"kvferry\"");
    res.set_header("Connection", "close");
    res.set_content("{\"error\":\"unauthorized: this kvferry cluster requires its bearer token\"}",
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
}

inline void refuse_request(httplib::Response& res, MacVerdict v) {
  res.status = 401;
  res.set_header("WWW-Authenticate", "KVF-MAC realm=\"kvferry\"");
  res.set_header("Connection", "close");
  res.set_content(std::string("{\"error\":\"unauthorized: this kvferry cluster requires a request MAC: ") +
                      verdict_text(v) + "\"}",
                  "application/json");
}

// `verifier` null: no secret, nothing required. Otherwise it must outlive the server.
inline void require_request_mac(httplib::Server& server, const RequestVerifier* verifier) {
  if (!verifier) return;
  server.set_pre_routing_handler([verifier](const httplib::Request& req, httplib::Response& res) {
    const MacVerdict v = verifier->precheck(req.get_header_value("Authorization"), unix_now_s());
    if (v == MacVerdict::kOk) return httplib::Server::HandlerResponse::Unhandled;
    refuse_request(res, v);
    return httplib::Server::HandlerResponse::Handled;
  });
}

// In a route, before it does anything: true when the request may go on; else the 401 is set.
// `req.target` is the request line's target, path and query string as sent.
inline bool check_request_mac(RequestVerifier* verifier, const httplib::Request& req, httplib::Response& res) {
  if (!verifier) return true;
  const MacVerdict v =
      verifier->verify(req.get_header_value("Authorization"), req.method, req.target, req.body, unix_now_s());
  if (v == MacVerdict::kOk) return true;
  refuse_request(res, v);
  return false;
}

}  // namespace kvferry::security
