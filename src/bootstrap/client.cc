// BootstrapClient (include/kvferry/bootstrap.h): one cpp-httplib client per BootstrapClient, every
// call bounded by the constructor's timeout (connect, read and write each), and as a whole, whatever
// the server does: its answer's body at most kMaxResponseBytes, the whole call at most
// kCallBudgetFactor x the timeout (cpp-httplib's timeouts apply to each read, so a server that
// drips a byte at a time, or streams without end, would otherwise hold the call, and its memory,
// for ever; issue 33's attack, findings 3 and 4).
//   no HTTP answer          -> kPeerUnreachable
//   404                     -> kInvalidArgument "not registered: ..." (callers retry)
//   410                     -> kPeerUnreachable "...: rank left (HTTP 410): ..." (the rank removed
//                              its entry; permanent: refusal.h)
//   400                     -> kInvalidArgument with the server's reason
//   401, 403                -> kInvalidArgument "...: not authorized (HTTP 401..." (no or another
//                              cluster secret, or clocks apart by more than the MAC's window,
//                              docs/security.md); permanent: refusal.h
//   other status, bad JSON  -> kProtocolError
// With cluster keys each request carries a MAC of itself (core/request_mac.h), never a token.
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bootstrap/rank_info_json.h"
#include "bootstrap/refusal.h"
#include "core/failure_json.h"
#include "core/request_mac.h"
#include "kvferry/bootstrap.h"
#include "kvferry/net.h"

namespace kvferry {
namespace {

// The server's {"error": ...} text (at most 1024 bytes), or the first 256 bytes of the raw body
// when it is not that shape (the server may be anyone's: the text goes into a status and a log line).
std::string server_reason(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object()) {
    auto it = j.find("error");
    if (it != j.end() && it->is_string()) return it->get<std::string>().substr(0, 1024);
  }
  return body.substr(0, 256);
}

constexpr size_t kMaxResponseBytes = 4u << 20;
constexpr int kCallBudgetFactor = 3;

// Stops `http` (cpp-httplib shuts its socket down, the call in progress fails) unless disarmed
// before `budget` passed.
class CallWatchdog {
 public:
  CallWatchdog(httplib::Client& http, std::chrono::milliseconds budget)
      : thread_([this, &http, budget] {
          std::unique_lock lock(mu_);
          if (!cv_.wait_for(lock, budget, [this] { return done_; })) {
            fired_ = true;
            http.stop();
          }
        }) {}
  ~CallWatchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  bool fired() {
    std::lock_guard lock(mu_);
    return fired_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool fired_ = false;
  std::thread thread_;  // last: it uses the members above
};

}  // namespace

struct BootstrapClient::Impl {
  std::string address;
  std::unique_ptr<httplib::Client> http;  // null when `address` is not "host:port"
  Status keys_error;                        // a bad cluster secret: every call fails with it
  const security::ClusterKeys* keys = nullptr;  // with a secret: each request carries its MAC
  std::chrono::milliseconds budget{1};      // one whole call (kCallBudgetFactor x the timeout)

  // GET/PUT and map transport failures and non-200 statuses; on 200 returns the parsed body.
  // `http_status`, if given, gets the answer's HTTP status (0: no answer).
  Result<nlohmann::json> call(const char* method, const std::string& path,
                              const std::string& body, int* http_status = nullptr) {
    if (!keys_error.ok()) return keys_error;
    if (!http) {
      return Status(ErrorCode::kInvalidArgument,
                    "bootstrap: address '" + address +
                        "' is not host:port, [IPv6]:port or http://host:port with a port other than 0");
    }
    try {
      httplib::Request req;
      req.method = method;
      req.path = path;
      if (std::string_view(method) != "GET") {
        req.body = body;
        req.set_header("Content-Type", "application/json");
      }
      // A MAC of this request only (core/request_mac.h): worth nothing for another request, even to
      // a server that is not the cluster's (the address may be one a request named).
      if (keys) req.set_header("Authorization", security::mac_authorization(*keys, method, path, req.body));
      std::string got;
      bool too_big = false;
      req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        if (got.size() + len > kMaxResponseBytes) {
          too_big = true;
          return false;
        }
        got.append(data, len);
        return true;
      };
      bool fired = false;
      httplib::Result res = [&] {
        CallWatchdog watchdog(*http, budget);
        httplib::Result r = http->send(req);
        fired = watchdog.fired();
        return r;
      }();
      if (too_big)
        return Status(ErrorCode::kProtocolError, "bootstrap " + address + ": answer to " + method + " " + path +
                                                     " longer than " + std::to_string(kMaxResponseBytes) + " bytes");
      if (fired)
        return Status(ErrorCode::kPeerUnreachable, "bootstrap " + address + " did not answer " + method + " " + path +
                                                       " within " + std::to_string(budget.count()) + " ms");
      if (!res) {
        return Status(ErrorCode::kPeerUnreachable, "bootstrap " + address + " unreachable (" +
                                                       httplib::to_string(res.error()) + ")");
      }
      res->body = std::move(got);
      if (http_status) *http_status = res->status;
      const std::string what = std::string(method) + " " + path;
      if (res->status == 404) {
        return Status(ErrorCode::kInvalidArgument, server_reason(res->body));
      }
      if (res->status == 410) {
        return Status(ErrorCode::kPeerUnreachable,
                      "bootstrap " + address + " answered " + what + std::string(bootstrap::kLeft) + server_reason(res->body));
      }
      if (res->status == 401 || res->status == 403) {
        return Status(ErrorCode::kInvalidArgument,
                      "bootstrap " + address + " refused " + what + std::string(bootstrap::kNotAuthorized) +
                          std::to_string(res->status) +
                          "; is KVFERRY_SECRET_FILE the cluster's secret, and do the clocks agree? "
                          "docs/security.md): " +
                          server_reason(res->body));
      }
      if (res->status == 400) {
        return Status(ErrorCode::kInvalidArgument,
                      "bootstrap rejected " + what + ": " + server_reason(res->body));
      }
      if (res->status != 200) {
        return Status(ErrorCode::kProtocolError, "bootstrap " + what + ": HTTP " +
                                                     std::to_string(res->status) + ": " +
                                                     server_reason(res->body));
      }
      auto j = nlohmann::json::parse(res->body, nullptr, false);
      if (j.is_discarded()) {
        return Status(ErrorCode::kProtocolError, "bootstrap " + what + ": invalid JSON reply");
      }
      return j;
    } catch (const std::exception& e) {
      return Status(ErrorCode::kInternal, std::string("bootstrap client: ") + e.what());
    }
  }
};

BootstrapClient::BootstrapClient(std::string address, int timeout_ms) : impl_(std::make_unique<Impl>()) {
  auto keys = security::cluster_keys();
  if (!keys.ok()) {
    impl_->address = std::move(address);
    impl_->keys_error = Status(keys.status().code(), "bootstrap client: " + keys.status().message());
    return;
  }
  init(std::move(address), timeout_ms, *keys);
}

BootstrapClient::BootstrapClient(std::string address, int timeout_ms, const security::ClusterKeys* keys)
    : impl_(std::make_unique<Impl>()) {
  init(std::move(address), timeout_ms, keys);
}

void BootstrapClient::init(std::string address, int timeout_ms, const security::ClusterKeys* keys) {
  impl_->address = std::move(address);
  auto hp = parse_host_port(impl_->address);
  if (!hp.ok() || hp->port == 0 || is_wildcard_host(hp->host)) return;
  try {
    impl_->http = std::make_unique<httplib::Client>(hp->host, hp->port);
    const auto t = std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : 1);
    impl_->budget = t * kCallBudgetFactor;
    impl_->http->set_connection_timeout(t);
    impl_->http->set_read_timeout(t);
    impl_->http->set_write_timeout(t);
    impl_->http->set_url_encode(false);  // the target on the wire is the one the MAC covers
    impl_->keys = keys;
  } catch (const std::exception&) {
    impl_->http.reset();
  }
}

BootstrapClient::~BootstrapClient() = default;

Status BootstrapClient::register_rank(const PrefillRankInfo& info) {
  auto r = impl_->call("PUT", "/route", bootstrap::dump(bootstrap::rank_info_to_json(info)));
  return r.status();
}

Status BootstrapClient::deregister(uint32_t engine_id, uint32_t dp_rank, uint32_t tp_rank, uint64_t incarnation) {
  return impl_->call("DELETE",
                     "/route?engine_id=" + std::to_string(engine_id) + "&dp_rank=" + std::to_string(dp_rank) +
                         "&tp_rank=" + std::to_string(tp_rank) + "&incarnation=" + std::to_string(incarnation),
                     "")
      .status();
}

Result<PrefillRankInfo> BootstrapClient::lookup(uint32_t engine_id, uint32_t dp_rank,
                                                uint32_t tp_rank) {
  auto r = impl_->call("GET",
                       "/route?engine_id=" + std::to_string(engine_id) +
                           "&dp_rank=" + std::to_string(dp_rank) +
                           "&tp_rank=" + std::to_string(tp_rank),
                       "");
  if (!r.ok()) return r.status();
  auto info = bootstrap::rank_info_from_json(*r);
  if (!info.ok()) {
    return Status(ErrorCode::kProtocolError, "bootstrap reply: " + info.status().message());
  }
  return info;
}

Result<std::vector<PrefillRankInfo>> BootstrapClient::lookup_all(uint32_t engine_id,
                                                                 uint32_t dp_rank) {
  auto r = impl_->call("GET",
                       "/route?engine_id=" + std::to_string(engine_id) +
                           "&dp_rank=" + std::to_string(dp_rank),
                       "");
  if (!r.ok()) return r.status();
  if (!r->is_array()) {
    return Status(ErrorCode::kProtocolError, "bootstrap reply: expected a JSON array");
  }
  std::vector<PrefillRankInfo> out;
  for (const auto& j : *r) {
    auto info = bootstrap::rank_info_from_json(j);
    if (!info.ok()) {
      return Status(ErrorCode::kProtocolError, "bootstrap reply: " + info.status().message());
    }
    out.push_back(std::move(info).value());
  }
  return out;
}

Status BootstrapClient::post_failure(uint64_t room, const Failure& f) {
  nlohmann::json j = {{"room", std::to_string(room)}};
  put_failure(j, f);
  return impl_->call("POST", "/failure", bootstrap::dump(j)).status();
}

Result<std::optional<Failure>> BootstrapClient::lookup_failure(uint64_t room) {
  int http_status = 0;
  auto r = impl_->call("GET", "/failure?room=" + std::to_string(room), "", &http_status);
  if (!r.ok()) {
    // 404: nothing posted for the room (yet); every other refusal is the caller's to report.
    if (http_status == 404) return std::optional<Failure>();
    return r.status();
  }
  auto room_field = r->is_object() ? r->find("room") : r->end();
  if (!r->is_object() || room_field == r->end() || !room_field->is_string() ||
      room_field->get<std::string>() != std::to_string(room))
    return Status(ErrorCode::kProtocolError, "bootstrap reply: the failure record is not room " + std::to_string(room));
  Result<Failure> f = get_failure(*r, "bootstrap failure record");
  if (!f.ok()) return f.status();
  return std::optional<Failure>(std::move(f).value());
}

Result<size_t> BootstrapClient::health() {
  auto r = impl_->call("GET", "/health", "");
  if (!r.ok()) return r.status();
  auto it = r->find("ranks");
  if (!r->is_object() || it == r->end() || !it->is_number_unsigned()) {
    return Status(ErrorCode::kProtocolError, "bootstrap reply: field 'ranks' missing or not a count");
  }
  return static_cast<size_t>(it->get<uint64_t>());
}

}  // namespace kvferry
