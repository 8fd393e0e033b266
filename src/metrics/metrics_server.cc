// MetricsServer (include/kvferry/metrics.h): cpp-httplib on its own thread, one route.
#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/http_auth.h"
#include "kvferry/metrics.h"
#include "kvferry/net.h"

namespace kvferry {

struct MetricsServer::Impl {
  httplib::Server http;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
  uint16_t port = 0;
};

MetricsServer::MetricsServer() : impl_(std::make_unique<Impl>()) {}

MetricsServer::~MetricsServer() {
  if (!impl_->thread.joinable()) return;
  while (!impl_->listen_returned) {  // stop() acts only on a running accept loop
    if (impl_->http.is_running()) {
      impl_->http.stop();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->thread.join();
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const RankMetrics& metrics, const std::string& host,
                                                            uint16_t port) {
  auto keys = security::cluster_keys();
  if (!keys.ok()) return Status(keys.status().code(), "metrics: " + keys.status().message());
  return start(metrics, host, port, *keys);
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const RankMetrics& metrics, const std::string& host,
                                                            uint16_t port, const security::ClusterKeys* keys) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  Impl& impl = *s->impl_;
  impl.http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // Not httplib's default SO_REUSEPORT: a second rank on the same port must fail, not share it.
  impl.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  security::require_bearer(impl.http, keys);
  impl.http.Get("/metrics", [&metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8");
  });
  auto checked = parse_host(host);
  if (!checked.ok()) return Status(checked.status().code(), "metrics: bind host: " + checked.status().message());
  // "*" and "" listen on IPv6 and IPv4 ("::"), or on IPv4 only where IPv6 is off.
  std::vector<std::string> hosts{bind_host_for_socket(*checked)};
  if (checked->empty() || *checked == "*") hosts.push_back("0.0.0.0");
  int bound = -1;
  for (size_t i = 0; i < hosts.size() && bound <= 0; ++i)
    bound = port == 0 ? impl.http.bind_to_any_port(hosts[i]) : (impl.http.bind_to_port(hosts[i], port) ? port : -1);
  if (bound <= 0) return Status(ErrorCode::kInternal, "metrics: cannot bind " + host_port(*checked, port));
  impl.port = static_cast<uint16_t>(bound);
  impl.thread = std::thread([&impl] {
    impl.http.listen_after_bind();
    impl.listen_returned = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!impl.http.is_running()) {
    if (impl.listen_returned || std::chrono::steady_clock::now() > deadline)
      return Status(ErrorCode::kInternal, "metrics: HTTP server on port " + std::to_string(port) + " did not start");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return s;
}

uint16_t MetricsServer::port() const { return impl_->port; }

}  // namespace kvferry
