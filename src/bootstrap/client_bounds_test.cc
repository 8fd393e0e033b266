// BootstrapClient against a server that answers without end (issue 33's attack, findings 3 and 4):
// the decode side looks up whatever bootstrap address a request names (vLLM's kv_transfer_params,
// SGLang's bootstrap_addr), so the server may be anyone's. A body that never ends is cut at the
// size bound; one dripped a byte at a time is cut at the call's budget. Each call must end, with
// its error, however slowly this machine runs; before the bounds both calls ran for ever.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "kvferry/bootstrap.h"

namespace kvferry {
namespace {

struct EndlessServer {
  httplib::Server http;
  std::thread thread;
  int port = 0;
  std::atomic<bool> stop{false};

  // `chunk` bytes per write, `gap_ms` between writes, until the client goes away.
  EndlessServer(size_t chunk, int gap_ms) {
    http.Get(R"(/.*)", [this, chunk, gap_ms](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("application/json", [this, chunk, gap_ms](size_t, httplib::DataSink& sink) {
        if (stop) return false;
        const std::string bytes(chunk, ' ');
        if (!sink.write(bytes.data(), bytes.size())) return false;
        if (gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
        return true;
      });
    });
    port = http.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { http.listen_after_bind(); });
  }
  ~EndlessServer() {
    stop = true;
    http.stop();
    thread.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

TEST(BootstrapClientBounds, AnAnswerWithoutEndIsCutAtTheSizeBound) {
  EndlessServer server(64 << 10, 0);
  ASSERT_GT(server.port, 0);
  BootstrapClient client(server.address(), 2000, nullptr);
  auto r = client.lookup(0, 0, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kProtocolError) << r.status().str();
  EXPECT_NE(r.status().message().find("longer than"), std::string::npos) << r.status().str();
}

TEST(BootstrapClientBounds, AnAnswerDrippedAByteAtATimeIsCutAtTheCallsBudget) {
  EndlessServer server(1, 20);  // every read gets a byte well within the 300 ms read timeout
  ASSERT_GT(server.port, 0);
  BootstrapClient client(server.address(), 300, nullptr);
  auto r = client.lookup(0, 0, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kPeerUnreachable) << r.status().str();
  EXPECT_NE(r.status().message().find("did not answer"), std::string::npos) << r.status().str();
}

}  // namespace
}  // namespace kvferry
