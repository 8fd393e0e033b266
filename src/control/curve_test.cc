// CURVE on the control sockets (control/curve.h): the same secret exchanges frames; a peer with
// another secret, with none, or with the server key but not the secret gets nothing through.
#include "control/curve.h"

#include <gtest/gtest.h>
#include <zmq.h>

#include <chrono>
#include <optional>

#include "kvferry/control.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Longer than ControlSocket's connect window (1 s): a frame that has not arrived by then was
// dropped by the sender, so none will.
constexpr auto kNoFrameDeadline = 2500ms;

security::ClusterKeys keys_of(const std::string& secret) {
  auto k = security::derive_keys(secret);
  EXPECT_TRUE(k.ok()) << k.status().str();
  return k.ok() ? *k : security::ClusterKeys{};
}

std::unique_ptr<ControlSocket> bind_local(const security::ClusterKeys* keys) {
  auto r = ControlSocket::bind("tcp://127.0.0.1:0", keys);
  EXPECT_TRUE(r.ok()) << r.status().str();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Sends `frame` from `from` to `to` and waits until `to` has a frame or `deadline` passed; the
// sender keeps calling recv() meanwhile, so frames it held while connecting are flushed.
std::optional<std::string> deliver(ControlSocket& from, ControlSocket& to, const std::string& frame,
                                   std::chrono::milliseconds deadline) {
  (void)from.send(to.endpoint(), frame);
  const auto until = Clock::now() + deadline;
  while (Clock::now() < until) {
    if (auto f = to.recv(5ms)) return f;
    (void)from.recv(0ms);
  }
  return std::nullopt;
}

const security::ClusterKeys kA = keys_of("the secret of cluster A, 0123456789");
const security::ClusterKeys kB = keys_of("the secret of cluster B, 0123456789");

TEST(Curve, SameSecretExchangesFrames) {
  auto server = bind_local(&kA);
  auto client = bind_local(&kA);
  ASSERT_TRUE(server && client);
  const uint64_t admitted = control::zap_admissions();
  auto f = deliver(*client, *server, "hello", 10s);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(*f, "hello");
  EXPECT_GT(control::zap_admissions(), admitted);
  // And back: the client's PULL socket is a CURVE server as well.
  auto back = deliver(*server, *client, "world", 10s);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, "world");
}

TEST(Curve, AnotherSecretGetsNothingThrough) {
  auto server = bind_local(&kA);
  auto client = bind_local(&kB);
  ASSERT_TRUE(server && client);
  EXPECT_FALSE(deliver(*client, *server, "intruder", kNoFrameDeadline).has_value());
}

TEST(Curve, NoSecretGetsNothingThrough) {
  auto server = bind_local(&kA);
  auto client = bind_local(nullptr);
  ASSERT_TRUE(server && client);
  EXPECT_FALSE(deliver(*client, *server, "intruder", kNoFrameDeadline).has_value());
  // Nor the other way: a CURVE client does not talk to a plain server.
  EXPECT_FALSE(deliver(*server, *client, "leak", kNoFrameDeadline).has_value());
}

// A client that learned the server's public key but has its own keypair: the handshake completes
// as far as ZAP, which refuses it.
TEST(Curve, ServerKeyWithoutTheSecretIsRefusedByZap) {
  auto server = bind_local(&kA);
  ASSERT_TRUE(server);
  char pub[41], sec[41];
  ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
  zmq::socket_t push(control::context(), zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 0);
  push.set(zmq::sockopt::curve_serverkey, kA.public_key());
  push.set(zmq::sockopt::curve_publickey, std::string(pub, 40));  // Z85
  push.set(zmq::sockopt::curve_secretkey, std::string(sec, 40));
  push.connect(server->endpoint());
  const uint64_t refused = control::zap_refusals();
  (void)push.send(zmq::buffer(std::string("intruder")), zmq::send_flags::dontwait);
  // The refusal is the event to wait for; the server must have seen no frame by then or after.
  const auto until = Clock::now() + 10s;
  std::optional<std::string> got;
  while (control::zap_refusals() == refused && Clock::now() < until && !got) got = server->recv(5ms);
  EXPECT_GT(control::zap_refusals(), refused);
  if (!got) got = server->recv(200ms);
  EXPECT_FALSE(got.has_value());
}

TEST(Curve, InprocEndpointsStillWork) {
  auto server = ControlSocket::bind("inproc://curve-test", &kA);
  ASSERT_TRUE(server.ok()) << server.status().str();
  auto client = bind_local(&kA);
  ASSERT_TRUE(client);
  auto f = deliver(*client, **server, "local", 10s);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(*f, "local");
}

}  // namespace
}  // namespace kvferry
