// Prefill ranks of one TP group and one decode rank as Managers in one process, caller-pumped
// (kvferry/manager.h, public API only): what the layer-wise and integrity tests share
// (manager_layers_test.cc, manager_integrity_test.cc).
// Thread contract: the test's thread.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "endpoint/waker.h"
#include "kvferry/bootstrap.h"
#include "kvferry/manager.h"

namespace kvferry::testing {

struct TpRanks {
  std::unique_ptr<BootstrapServer> server;
  std::vector<std::unique_ptr<Manager>> prefill;
  std::unique_ptr<Manager> decode;

  // Pumps every rank until pred() holds or `timeout` passed.
  bool until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      for (auto& p : prefill) p->progress();
      decode->progress();
      if (pred()) return true;
      if (std::chrono::steady_clock::now() > end) return false;
      std::vector<int> fds = decode->wait_fds();
      for (auto& p : prefill)
        for (int fd : p->wait_fds()) fds.push_back(fd);
      wait_readable(fds.data(), static_cast<int>(fds.size()), 1);
    }
  }
};

// The configuration of rank `self` (TP `tp`, the other engine's TP `peer_tp`) at `bootstrap`.
using TpConfig = std::function<ManagerConfig(const RankId& self, uint32_t tp, uint32_t peer_tp, const std::string& bootstrap)>;

// `prefill_tp` prefill ranks and one decode rank (TP 1) at a bootstrap service of their own, once
// the decode rank's pool registration reached every prefill rank; null (with a test failure) if not.
inline std::unique_ptr<TpRanks> make_tp_ranks(uint32_t prefill_tp, const TpConfig& config) {
  auto r = std::make_unique<TpRanks>();
  auto server = BootstrapServer::start("127.0.0.1", 0);
  EXPECT_TRUE(server.ok());
  if (!server.ok()) return nullptr;
  r->server = std::move(server).value();
  const std::string bootstrap = "127.0.0.1:" + std::to_string(r->server->port());
  for (uint32_t t = 0; t < prefill_tp; ++t) {
    auto p = Manager::create(config({Role::kPrefill, 0, t, 0}, prefill_tp, 1, bootstrap));
    EXPECT_TRUE(p.ok()) << p.status().str();
    if (!p.ok()) return nullptr;
    r->prefill.push_back(std::move(p).value());
  }
  auto d = Manager::create(config({Role::kDecode, 0, 0, 0}, 1, prefill_tp, bootstrap));
  EXPECT_TRUE(d.ok()) << d.status().str();
  if (!d.ok()) return nullptr;
  r->decode = std::move(d).value();
  if (!r->until([&] {
        for (auto& p : r->prefill)
          if (p->stats().peers != 1) return false;
        return true;
      })) {
    ADD_FAILURE() << "the decode pool registration never reached every prefill manager";
    return nullptr;
  }
  return r;
}

}  // namespace kvferry::testing
