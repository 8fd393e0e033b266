// A forged acknowledgement (tcp, active messages): a third worker that knows a batch's id sends
// the writer an ack for it. The writer settles a batch only by an ack that came back on the
// endpoint the batch went out on (docs/security.md, "Acknowledgements"), so the forged ones are
// counted and dropped and the batch stays in flight until its real fate.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "transport/ucx/transport_test_util.h"
#include "transport/ucx/ucx_transport.h"

namespace kvferry::ucx {
namespace {

using namespace std::chrono_literals;
using testing::Completion;

constexpr uint64_t kRegion = 4ull << 20;

struct Pair {
  std::unique_ptr<UcxTransport> a, b;
  LocalRegion ra, rb;
  PeerId peer = 0;  // A's id for B
};

// A raw UCX worker in this process, speaking the transport's AM ids as a liar would: its own
// context (configured like a tcp transport's) and one endpoint to the target worker.
class RawWorker {
 public:
  explicit RawWorker(const std::string& target_address) {
    TransportOptions opt;
    opt.kind = TransportKind::kTcp;
    auto ctx = UcxTransport::create_context(opt, {}, /*shared_workers=*/false);
    if (!ctx.ok()) {
      ADD_FAILURE() << ctx.status().message();
      return;
    }
    context_ = ctx.value();
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(context_, &wp, &worker_) != UCS_OK) {
      ADD_FAILURE() << "ucp_worker_create";
      return;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(target_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    if (ucp_ep_create(worker_, &ep, &ep_) != UCS_OK) ADD_FAILURE() << "ucp_ep_create";
  }
  ~RawWorker() {
    if (ep_ != nullptr) {
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      wait(ucp_ep_close_nbx(ep_, &prm));
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }
  bool ready() const { return ep_ != nullptr; }

  // Sends an ack AM for `batch_id`; `reply` adds UCP_AM_SEND_FLAG_REPLY, so the target learns
  // an endpoint for it (its own endpoint back to this worker). True once the send completed.
  bool send_ack(uint64_t batch_id, ErrorCode code, bool reply) {
    AmAck ack;
    ack.batch_id = batch_id;
    ack.code = static_cast<uint16_t>(code);
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_AM_SEND_FLAG_EAGER | (reply ? UCP_AM_SEND_FLAG_REPLY : 0);
    return wait(ucp_am_send_nbx(ep_, kAmAckId, nullptr, 0, &ack, sizeof ack, &prm));
  }
  void progress() { ucp_worker_progress(worker_); }

 private:
  bool wait(void* req) {
    if (req == nullptr) return true;
    if (UCS_PTR_IS_ERR(req)) return false;
    ucs_status_t s;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(req);
    return s == UCS_OK;
  }
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
};

TEST(UcxForgedAck, AnAckFromAnotherEndpointDoesNotSettleTheBatch) {
  std::atomic<uint64_t> batch_id{0};
  UcxTestHooks writer;
  writer.on_batch_id = [&batch_id](uint64_t id) { batch_id.store(id); };
  UcxTestHooks receiver;
  receiver.suppress_acks = true;  // B places the data but never answers: the batch stays open
  TransportOptions opt;
  opt.kind = TransportKind::kTcp;
  auto a = UcxTransport::create(opt, writer);
  auto b = UcxTransport::create(opt, receiver);
  ASSERT_TRUE(a.ok() && b.ok());
  Pair p;
  p.a = std::move(a).value();
  p.b = std::move(b).value();
  testing::wire_pair(p, kRegion, 0xEE);
  ASSERT_NE(p.peer, 0u);

  Completion c;
  p.a->write(p.peer, 7, {{0, 0, 64 << 10}}, c.callback());
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (batch_id.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_NE(batch_id.load(), 0u);

  RawWorker liar(p.a->address());
  ASSERT_TRUE(liar.ready());
  // "Placed" with an endpoint of its own, "refused" with one, "placed" with none: on the old
  // matching (by id alone) the first would have turned the batch into Success.
  ASSERT_TRUE(liar.send_ack(batch_id.load(), ErrorCode::kOk, /*reply=*/true));
  ASSERT_TRUE(liar.send_ack(batch_id.load(), ErrorCode::kTransferError, /*reply=*/true));
  ASSERT_TRUE(liar.send_ack(batch_id.load(), ErrorCode::kOk, /*reply=*/false));
  while (p.a->foreign_acks() < 3 && std::chrono::steady_clock::now() < deadline) {
    liar.progress();
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(p.a->foreign_acks(), 3u);
  EXPECT_EQ(c.future.wait_for(0s), std::future_status::timeout) << "a forged ack settled it";

  // The batch's real fate still reaches it, once: here A gives up on B.
  p.a->disconnect(p.peer);
  Status st = c.wait();
  EXPECT_EQ(st.code(), ErrorCode::kTransferError) << st.message();
  EXPECT_EQ(c.calls->load(), 1);
}

TEST(UcxForgedAck, RealAcksStillSettleBatchesAndConnects) {
  std::atomic<uint64_t> batches{0};
  UcxTestHooks writer;
  writer.on_batch_id = [&batches](uint64_t) { batches.fetch_add(1); };
  TransportOptions opt;
  opt.kind = TransportKind::kTcp;
  auto a = UcxTransport::create(opt, writer);
  auto b = UcxTransport::create(opt);
  ASSERT_TRUE(a.ok() && b.ok());
  Pair p;
  p.a = std::move(a).value();
  p.b = std::move(b).value();
  testing::wire_pair(p, kRegion, 0xEE);  // the connect's ping was settled by B's ack
  ASSERT_NE(p.peer, 0u);
  for (uint64_t room = 0; room < 4; ++room) {
    EXPECT_TRUE(testing::write_and_wait(*p.a, p.peer, room, {{0, room * 4096, 4096}}).ok());
  }
  EXPECT_EQ(batches.load(), 4u);
  EXPECT_EQ(p.a->foreign_acks(), 0u);
}

}  // namespace
}  // namespace kvferry::ucx
