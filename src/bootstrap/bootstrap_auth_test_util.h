// Shared by the bootstrap service's authentication tests (bootstrap_auth_test.cc,
// bootstrap_rogue_test.cc): cluster keys from a secret, a prefill rank's entry, and a service
// started with those keys on loopback.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/secret.h"
#include "kvferry/bootstrap.h"

namespace kvferry::testing {

inline security::ClusterKeys keys_of(const std::string& secret) {
  auto k = security::derive_keys(secret);
  EXPECT_TRUE(k.ok()) << k.status().str();
  return k.ok() ? *k : security::ClusterKeys{};
}

// A TP-1 prefill rank of Llama-3-8B's shape whose control endpoint is `control_endpoint`.
inline PrefillRankInfo test_rank(const std::string& control_endpoint) {
  PrefillRankInfo r;
  r.engine_id = 0;
  r.tp_rank = 0;
  r.tp_size = 1;
  r.host = "127.0.0.1";
  r.control_endpoint = control_endpoint;
  r.page_size = 16;
  r.dtype = "bfloat16";
  r.model = "llama3-8b";
  r.num_layers = 32;
  r.heads_per_rank = 8;
  return r;
}

// The bootstrap service on 127.0.0.1 (a free port) with `keys` (nullptr: no secret).
inline std::unique_ptr<BootstrapServer> start_service(const security::ClusterKeys* keys) {
  ListenAddress a;
  a.bind_host = "127.0.0.1";
  auto s = BootstrapServer::start(a, keys);
  EXPECT_TRUE(s.ok()) << s.status().str();
  return s.ok() ? std::move(s).value() : nullptr;
}

}  // namespace kvferry::testing
