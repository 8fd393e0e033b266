// CURVE and the ZAP handler (curve.h). ZAP (RFC 27): a request is
//   version "1.0" | request id | domain | address | identity | mechanism | credentials...
// and the reply  version | request id | status code | status text | user id | metadata.
#include "control/curve.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>
#include <zmq_addon.hpp>

namespace kvferry::control {
namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";

std::atomic<uint64_t> admitted{0};
std::atomic<uint64_t> refused{0};

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

// Decides one request: "200" when the mechanism is CURVE and the client's key is the one the
// domain names.
bool admit(const std::vector<zmq::message_t>& req) {
  if (req.size() < 7) return false;
  if (req[5].to_string() != "CURVE") return false;
  const std::string key = req[6].to_string();
  return key.size() == 32 && !req[2].empty() && hex(key) == req[2].to_string();
}

void serve(zmq::socket_t rep) {
  for (;;) {
    try {
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(rep, std::back_inserter(req))) continue;
      const bool ok = admit(req);
      (ok ? admitted : refused).fetch_add(1);
      std::vector<zmq::message_t> reply;
      reply.emplace_back(std::string("1.0"));
      reply.emplace_back(req.size() > 1 ? req[1].to_string() : std::string());
      reply.emplace_back(std::string(ok ? "200" : "400"));
      reply.emplace_back(std::string(ok ? "OK" : "not a key of this cluster"));
      reply.emplace_back(std::string());
      reply.emplace_back(std::string());
      zmq::send_multipart(rep, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;  // the context is never terminated; be safe anyway
      // EINTR or a malformed exchange: a REP socket in a bad state is rebuilt by libzmq's next recv.
    } catch (...) {
      // Nothing may leave this thread.
    }
  }
}

Status start_zap_handler() {
  static std::once_flag once;
  static std::optional<Status> result;
  std::call_once(once, [] {
    try {
      zmq::socket_t rep(context(), zmq::socket_type::rep);
      rep.set(zmq::sockopt::linger, 0);
      rep.bind(kZapEndpoint);  // bound before any CURVE server handshakes
      std::thread(serve, std::move(rep)).detach();
      result = Status::Ok();
    } catch (const zmq::error_t& e) {
      result = Status(ErrorCode::kInternal, std::string("control socket: cannot start the ZAP handler: ") + e.what());
    }
  });
  return *result;
}

}  // namespace

zmq::context_t& context() {
  static zmq::context_t* ctx = new zmq::context_t(1);
  return *ctx;
}

Status make_curve_server(zmq::socket_t& s, const security::ClusterKeys& keys) {
  if (Status st = start_zap_handler(); !st.ok()) return st;
  s.set(zmq::sockopt::zap_domain, hex(keys.public_key()));
  s.set(zmq::sockopt::curve_server, true);
  s.set(zmq::sockopt::curve_secretkey, keys.secret_key());
  return Status::Ok();
}

void make_curve_client(zmq::socket_t& s, const security::ClusterKeys& keys) {
  s.set(zmq::sockopt::curve_serverkey, keys.public_key());
  s.set(zmq::sockopt::curve_publickey, keys.public_key());
  s.set(zmq::sockopt::curve_secretkey, keys.secret_key());
}

uint64_t zap_admissions() { return admitted.load(); }
uint64_t zap_refusals() { return refused.load(); }

}  // namespace kvferry::control
