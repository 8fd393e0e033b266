// Uses an installed kvferry through its public headers only: the error vocabulary, KVPoll, a pool
// layout, the bootstrap service and client over a real socket, and a UCX transport with a region.
// (The engine's view, a prefill and a decode Manager moving rooms, is main.cc.)
// Prints "consumer ok" and exits 0 when every check holds; otherwise names the first that failed.
#include <cstdio>
#include <cstring>
#include <string>

#include "kvferry/bootstrap.h"
#include "kvferry/error.h"
#include "kvferry/geometry.h"
#include "kvferry/poll.h"
#include "kvferry/transport.h"

namespace {
int fail(const std::string& what) {
  std::fprintf(stderr, "consumer: %s\n", what.c_str());
  return 1;
}
}  // namespace

int main() {
  using namespace kvferry;
  if (static_cast<int>(KVPoll::Transferring) != 3 || to_string(KVPoll::Success) != "Success")
    return fail("KVPoll values");
  if (code_name(ErrorCode::kTransferError) != "transfer_error") return fail("code_name");
  auto rank = RankId::parse("prefill/tp1");
  if (!rank || rank->tp_rank != 1 || rank->str() != "prefill/tp1") return fail("RankId::parse");

  ModelGeometry m{"tiny", "GQA", 2, 2, 4, 8, 2};  // 2 layers, K and V, 4 heads of 8 bf16
  auto layout = make_layout(m, 2, 1, 16, 1 << 20, 8);
  if (!layout.ok()) return fail(layout.status().str());
  if (layout->heads_per_rank != 2 || layout->first_head != 2 || layout->page_bytes() != 16 * 2 * 8 * 2)
    return fail("layout");

  auto server = BootstrapServer::start("127.0.0.1", 0);
  if (!server.ok()) return fail(server.status().str());
  BootstrapClient client("127.0.0.1:" + std::to_string((*server)->port()));
  PrefillRankInfo info;
  info.tp_rank = 1;
  info.tp_size = 2;
  info.host = "127.0.0.1";
  info.control_endpoint = "tcp://127.0.0.1:5555";
  info.model = "tiny";
  if (Status s = client.register_rank(info); !s.ok()) return fail(s.str());
  auto found = client.lookup(0, 0, 1);
  if (!found.ok() || found->control_endpoint != info.control_endpoint) return fail("bootstrap lookup");

  auto transport = make_ucx_transport({TransportKind::kTcp, ""});
  if (!transport.ok()) return fail(transport.status().str());
  auto region = (*transport)->create_region(layout->total_bytes());
  if (!region.ok() || region->bytes != layout->total_bytes()) return fail("create_region");
  std::memset(region->base, 0x5a, region->bytes);
  std::printf("consumer ok: %s, %llu pages, bootstrap port %u\n", rank->str().c_str(),
              static_cast<unsigned long long>(layout->num_pages), (*server)->port());
  return 0;
}
