// Bearer-token authentication for kvferry's cpp-httplib servers and clients (docs/security.md).
// Header-only so that only components that link cpp-httplib (bootstrap, metrics) see httplib.
// With cluster keys (core/secret.h), a server answers 401 to any request whose Authorization
// header is not "Bearer <token>" (constant-time compare) in its pre-routing handler, before a
// route runs or a body is read, and closes the connection; a client sends the header.
// Without keys both are as before.
#pragma once
#include <httplib.h>

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

inline void send_bearer(httplib::Client& client, const ClusterKeys* keys) {
  if (keys) client.set_bearer_token_auth(keys->bearer_token);
}

}  // namespace kvferry::security
