// BootstrapServer (include/kvferry/bootstrap.h): cpp-httplib server on its own threads, a map of
// registered prefill ranks behind a mutex (at most kMaxRegisteredRanks), and SGLang's routes on the
// same port (bootstrap/sglang_routes.h: a PUT /route body with "rank_ip", a GET /route with
// "prefill_dp_rank", /register_dp_rank, /query_dp_ranks) and the failure board (POST/GET /failure,
// bootstrap/failure_board.h). A rank that leaves removes its entry (DELETE /route, at its own
// incarnation); the key is remembered as departed (at most kMaxDepartedRanks keys, the oldest
// dropped first) so a lookup of it answers 410 at once instead of 404 "not yet". Every handler validates its input and
// answers 400 with {"error": ...} naming the field; bodies are bounded by kMaxBodyBytes (413 beyond).
#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "bootstrap/failure_board.h"
#include "bootstrap/rank_info_json.h"
#include "bootstrap/sglang_routes.h"
#include "core/http_auth.h"
#include "core/tcp_probe.h"
#include "kvferry/bootstrap.h"
#include "kvferry/log.h"
#include "kvferry/net.h"

namespace kvferry {
namespace {

constexpr size_t kMaxBodyBytes = 1024 * 1024;  // a /query_dp_ranks of kMaxSglangQueryRooms rooms fits
constexpr size_t kMaxRegisteredRanks = 16384;
// From one source address (one host registers its ranks; a peer filling the table from one host
// cannot lock every other host's ranks out).
constexpr size_t kMaxRanksPerSource = 1024;
// Keys whose rank left (DELETE /route) remembered for their lookups' 410; past it one goes (its
// lookups then answer 404, as for a rank never registered).
constexpr size_t kMaxDepartedRanks = 16384;
// One connection per worker thread (cpp-httplib). Idle or half-sent connections hold a thread until
// a read times out (kReadTimeoutS; keep-alive connections kKeepAliveS): more threads and short
// timeouts make a handful of them stall nothing (docs/security.md "The failure board").
constexpr size_t kHttpThreads = 32;
constexpr time_t kReadTimeoutS = 2;
constexpr time_t kKeepAliveS = 2;
constexpr auto kStartTimeout = std::chrono::seconds(5);
constexpr const char* kJson = "application/json";

using Key = std::tuple<uint32_t, uint32_t, uint32_t>;  // engine_id, dp_rank, tp_rank

void reply(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(bootstrap::dump(body), kJson);
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(bootstrap::error_body(message), kJson);
}

// A required u64 query parameter (decimal). Sets a 400 reply and returns false when missing or invalid.
bool query_u64(const httplib::Request& req, httplib::Response& res, const char* name, uint64_t* out) {
  const std::string v = req.has_param(name) ? req.get_param_value(name) : std::string();
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    reply_error(res, 400, "query parameter '" + std::string(name) + "': expected an unsigned 64-bit integer");
    return false;
  }
  return true;
}

// A required (or optional) u32 query parameter. Sets a 400 reply and returns false when invalid.
bool query_u32(const httplib::Request& req, httplib::Response& res, const char* name,
               bool required, std::optional<uint32_t>* out) {
  if (!req.has_param(name)) {
    if (required) reply_error(res, 400, "query parameter '" + std::string(name) + "': missing");
    return !required;
  }
  const std::string v = req.get_param_value(name);
  uint32_t x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    reply_error(res, 400,
                "query parameter '" + std::string(name) + "': expected an unsigned 32-bit integer");
    return false;
  }
  *out = x;
  return true;
}

}  // namespace

struct BootstrapServer::Impl {
  httplib::Server http;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
  uint16_t port = 0;
  std::string advertised;  // host clients are told (address())
  // With the secret: checks each request's MAC and remembers its nonce (core/request_mac.h).
  std::unique_ptr<security::RequestVerifier> verifier;
  mutable std::mutex mu;
  // A registered rank: what it PUT, the address the PUT came from, and whether its control
  // endpoint is on that host (handle_put()).
  struct Entry {
    PrefillRankInfo info;
    std::string source;
    bool own_host = false;
  };
  std::map<Key, Entry> ranks;                  // guarded by mu
  std::map<std::string, size_t> per_source;    // entries by the address they came from (guarded by mu)
  // Keys whose rank removed its entry (DELETE /route) and did not register again: the incarnation
  // that left and when (a sequence number); past kMaxDepartedRanks the oldest is dropped.
  std::map<Key, std::pair<uint64_t, uint64_t>> departed;  // guarded by mu
  std::map<uint64_t, Key> departed_order;                 // sequence -> key (guarded by mu)
  uint64_t departures = 0;                                // guarded by mu
  void forget_departed(const Key& key) {
    if (auto d = departed.find(key); d != departed.end()) {
      departed_order.erase(d->second.second);
      departed.erase(d);
    }
  }
  uint64_t deregistrations = 0;                // entries removed (guarded by mu)
  uint64_t lookups = 0;                        // GET /route of kvferry ranks (guarded by mu)
  uint64_t refused_deregistrations = 0;        // DELETEs that removed nothing (guarded by mu)
  uint64_t overwrites = 0;          // entries replaced by a different one (guarded by mu)
  uint64_t refused_overwrites = 0;  // PUTs not applied: an older incarnation, a dead endpoint (guarded by mu)
  int64_t overwrite_line_ns = 0;    // the last overwrite warning, and how many since (guarded by mu)
  uint64_t overwrites_since_line = 0;
  uint64_t overwrite_debug_lines = 0;  // since the last warning (guarded by mu)

  // One warning per 10 s, naming how many entries were replaced since the previous one.
  void note_overwrite(const Key& key, const PrefillRankInfo& had, const PrefillRankInfo& now) {
    ++overwrites_since_line;
    const int64_t t = monotonic_ns();
    const bool line = overwrite_line_ns == 0 || t - overwrite_line_ns >= 10'000'000'000;
    const std::string what = fmt::format(
        "bootstrap entry of engine_id {} dp_rank {} tp_rank {} replaced: {} (incarnation {}) -> {} (incarnation {})",
        std::get<0>(key), std::get<1>(key), std::get<2>(key), had.control_endpoint, had.incarnation,
        now.control_endpoint, now.incarnation);
    if (!line) {  // at most 20 debug lines between two warnings; the next warning has the count
      if (++overwrite_debug_lines <= 20)
        log_event(LogLevel::kDebug, "bootstrap", what, {.extra = {{"event", "entry_replaced"}}});
      return;
    }
    overwrite_debug_lines = 0;
    log_event(LogLevel::kWarning, "bootstrap",
              overwrites_since_line > 1 ? fmt::format("{} ({} entries replaced since the last such line)", what,
                                                      overwrites_since_line)
                                        : what,
              {.extra = {{"event", "entry_replaced"}}});
    overwrite_line_ns = t;
    overwrites_since_line = 0;
  }
  bootstrap::SglangRegistry sglang;       // its own lock
  bootstrap::FailureBoard failures;       // its own lock (bootstrap/failure_board.h)
  std::mutex probe_mu;                    // guards the three below (liveness())
  std::map<std::string, std::pair<TcpProbe, int64_t>> probed;
  int64_t probe_window_ns = 0;
  int probes_in_window = 0;

  static void send(httplib::Response& res, const bootstrap::Reply& r) {
    res.status = r.status;
    res.set_content(r.body, r.content_type);
  }

  static nlohmann::json parse(const std::string& body) {
    return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  }

  void count_refused() {
    std::lock_guard<std::mutex> lock(mu);
    ++refused_overwrites;
  }

  // Whether `endpoint` ("tcp://HOST:PORT") names the host `remote` (a request's source address).
  static bool endpoint_on_host(const std::string& endpoint, const std::string& remote) {
    if (!endpoint.starts_with("tcp://") || remote.empty()) return false;
    auto hp = parse_host_port(endpoint);
    return hp.ok() && hp->host == remote;
  }

  void refuse_older(httplib::Response& res, const Key& key, const PrefillRankInfo& had, const PrefillRankInfo& info) {
    count_refused();
    reply_error(res, 400,
                "incarnation " + std::to_string(info.incarnation) + " is older than the registered " +
                    std::to_string(had.incarnation) + " of engine_id " + std::to_string(std::get<0>(key)) +
                    " dp_rank " + std::to_string(std::get<1>(key)) + " tp_rank " + std::to_string(std::get<2>(key)));
  }

  // Whether a process listens at a control endpoint a PUT names or an entry holds (a TCP connect,
  // core/tcp_probe.h; 200 ms at most). Each answer is kept for 1 s (256 endpoints at most) and at
  // most 20 probes run a second, so a flood of PUTs neither stalls the service nor makes it scan
  // ports: past that budget the answer is unknown (nullopt) and incarnations alone decide.
  std::optional<TcpProbe> liveness(const std::string& endpoint) {
    const int64_t now = monotonic_ns();
    {
      std::lock_guard<std::mutex> lock(probe_mu);
      if (auto it = probed.find(endpoint); it != probed.end() && now - it->second.second < 1'000'000'000)
        return it->second.first;
      if (now - probe_window_ns >= 1'000'000'000) {
        probe_window_ns = now;
        probes_in_window = 0;
      }
      if (probes_in_window >= 20) return std::nullopt;
      ++probes_in_window;
    }
    const TcpProbe p = probe_tcp_endpoint(endpoint, 200);
    std::lock_guard<std::mutex> lock(probe_mu);
    if (probed.size() >= 256) probed.clear();
    probed[endpoint] = {p, monotonic_ns()};
    return p;
  }

  void handle_put(const httplib::Request& req, httplib::Response& res) {
    auto j = parse(req.body);
    if (j.is_discarded()) return reply_error(res, 400, "body: invalid JSON");
    if (j.is_object() && j.contains("rank_ip")) return send(res, sglang.put_route(j));  // SGLang's shape
    auto info = bootstrap::rank_info_from_json(j);
    if (!info.ok()) return reply_error(res, 400, info.status().message());
    // An incarnation is the rank's CLOCK_REALTIME ns at start (kvferry/messages.h): one far ahead of
    // this clock would lock the rank's later restarts out (no newer one could replace it), as the
    // ranks refuse it too (60 s, docs/security.md "Checked without the secret").
    constexpr int64_t kMaxSkewNs = 60'000'000'000;
    if (const int64_t now = realtime_ns(); info->incarnation > static_cast<uint64_t>(now) + kMaxSkewNs) {
      count_refused();
      return reply_error(res, 400, "incarnation " + std::to_string(info->incarnation) +
                                       " is more than 60 s ahead of this service's clock (" + std::to_string(now) + ")");
    }
    const Key key{info->engine_id, info->dp_rank, info->tp_rank};
    // A PUT names a control endpoint on the host it came from (its host literal is the request's
    // source address): the rank's own. Only such endpoints are probed (so the service connects only
    // to the host that asked: it scans nothing), and an entry registered so is replaced only by a
    // PUT that is too (a peer elsewhere cannot take a rank's entry over; attack 2b).
    const bool own_host = endpoint_on_host(info->control_endpoint, req.remote_addr);
    std::optional<Entry> had;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = ranks.find(key);
      if (it == ranks.end()) {
        if (ranks.size() >= kMaxRegisteredRanks)
          return reply_error(res, 400, "too many registered ranks (" + std::to_string(kMaxRegisteredRanks) + ")");
        if (auto n = per_source.find(req.remote_addr); n != per_source.end() && n->second >= kMaxRanksPerSource)
          return reply_error(res, 400, "too many registered ranks from " + req.remote_addr + " (" +
                                           std::to_string(kMaxRanksPerSource) + ")");
      } else {
        had = it->second;
      }
    }
    if (had && had->info.control_endpoint != info->control_endpoint) {
      const bool older = info->incarnation < had->info.incarnation;
      if (had->own_host && !own_host) {
        count_refused();
        return reply_error(res, 400, "the entry names " + had->info.control_endpoint +
                                         ", registered from its own host; a PUT from " + req.remote_addr +
                                         " naming another host's endpoint does not replace it");
      }
      if (had->own_host && own_host) {
        // Both on the hosts that registered them (probes reach those hosts only, outside the lock):
        // an older PUT replaces a newer entry whose endpoint refuses connects when its own accepts
        // them (a rank restarted while its entry was stamped ahead); a newer PUT naming a dead
        // endpoint never replaces a live entry.
        const std::optional<TcpProbe> was = liveness(had->info.control_endpoint);
        const std::optional<TcpProbe> is = liveness(info->control_endpoint);
        const bool was_alive = was == TcpProbe::kAccepts, was_dead = was == TcpProbe::kRefused;
        const bool is_alive = is == TcpProbe::kAccepts, is_dead = is == TcpProbe::kRefused;
        if (older && !(was_dead && is_alive)) return refuse_older(res, key, had->info, *info);
        if (!older && is_dead && was_alive) {
          count_refused();
          return reply_error(res, 400, "nothing accepts connects at " + info->control_endpoint +
                                           ", while the registered entry's " + had->info.control_endpoint + " does");
        }
      } else if (older && !own_host) {
        return refuse_older(res, key, had->info, *info);  // neither on its own host: incarnations decide
      }
      // else: a PUT from the endpoint's own host replaces an entry that was not (whatever its age).
    } else if (had && info->incarnation < had->info.incarnation) {
      // The same endpoint: only the incarnation differs, so the entry already leads to this rank
      // (whoever answers there tells a peer its incarnation). The newer incarnation is kept.
      count_refused();
      return reply(res, 200, {{"ok", true}, {"kept_incarnation", had->info.incarnation}});
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = ranks.find(key);
      if (it == ranks.end() && ranks.size() >= kMaxRegisteredRanks)
        return reply_error(res, 400, "too many registered ranks (" + std::to_string(kMaxRegisteredRanks) + ")");
      if (it != ranks.end()) {
        const PrefillRankInfo& now = it->second.info;
        if (had && (now.incarnation != had->info.incarnation || now.control_endpoint != had->info.control_endpoint))
          return reply_error(res, 409, "the entry changed while this PUT was checked; PUT again");
        if (now.control_endpoint != info->control_endpoint || now.incarnation != info->incarnation) {
          ++overwrites;
          note_overwrite(key, now, *info);
        }
        if (--per_source[it->second.source] == 0) per_source.erase(it->second.source);
      }
      ranks[key] = Entry{*info, req.remote_addr, own_host};
      ++per_source[req.remote_addr];
      forget_departed(key);  // back (a new process, or the same one registering again)
    }
    reply(res, 200, {{"ok", true}});
  }

  void handle_get(const httplib::Request& req, httplib::Response& res) {
    if (req.has_param("prefill_dp_rank") || req.has_param("target_tp_rank")) {  // SGLang's shape
      auto param = [&](const char* n, std::string* out) -> const std::string* {
        if (!req.has_param(n)) return nullptr;
        *out = req.get_param_value(n);
        return out;
      };
      std::string d, c, t, p;
      return send(res, sglang.get_route(param("prefill_dp_rank", &d), param("prefill_cp_rank", &c),
                                        param("target_tp_rank", &t), param("target_pp_rank", &p)));
    }
    std::optional<uint32_t> engine, dp, tp;
    if (!query_u32(req, res, "engine_id", true, &engine) ||
        !query_u32(req, res, "dp_rank", true, &dp) || !query_u32(req, res, "tp_rank", false, &tp)) {
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    ++lookups;
    if (tp) {
      auto it = ranks.find(Key{*engine, *dp, *tp});
      if (auto gone = departed.find(Key{*engine, *dp, *tp}); it == ranks.end() && gone != departed.end()) {
        return reply_error(res, 410,
                           "left: engine_id " + std::to_string(*engine) + " dp_rank " + std::to_string(*dp) +
                               " tp_rank " + std::to_string(*tp) + " removed its entry (incarnation " +
                               std::to_string(gone->second.first) + "); it serves no more rooms");
      }
      if (it == ranks.end()) {
        return reply_error(res, 404,
                           "not registered: engine_id " + std::to_string(*engine) + " dp_rank " +
                               std::to_string(*dp) + " tp_rank " + std::to_string(*tp));
      }
      return reply(res, 200, bootstrap::rank_info_to_json(it->second.info));
    }
    auto all = nlohmann::json::array();
    for (auto it = ranks.lower_bound(Key{*engine, *dp, 0});
         it != ranks.end() && std::get<0>(it->first) == *engine && std::get<1>(it->first) == *dp;
         ++it) {
      all.push_back(bootstrap::rank_info_to_json(it->second.info));
    }
    reply(res, 200, all);
  }

  // DELETE /route?engine_id=E&dp_rank=D&tp_rank=R&incarnation=I: the rank leaves. Removes the
  // entry only if it holds incarnation I (a stale process cannot remove its successor's entry) and,
  // when it was registered from its control endpoint's own host, only if the DELETE comes from the
  // address that registered it (as handle_put() keeps it from being replaced from elsewhere). A
  // refused DELETE changes nothing.
  void handle_delete(const httplib::Request& req, httplib::Response& res) {
    std::optional<uint32_t> engine, dp, tp;
    uint64_t incarnation = 0;
    if (!query_u32(req, res, "engine_id", true, &engine) || !query_u32(req, res, "dp_rank", true, &dp) ||
        !query_u32(req, res, "tp_rank", true, &tp) || !query_u64(req, res, "incarnation", &incarnation))
      return;
    const Key key{*engine, *dp, *tp};
    const std::string name = "engine_id " + std::to_string(*engine) + " dp_rank " + std::to_string(*dp) +
                             " tp_rank " + std::to_string(*tp);
    std::lock_guard<std::mutex> lock(mu);
    auto it = ranks.find(key);
    if (it == ranks.end()) {
      ++refused_deregistrations;
      return reply_error(res, 404, "not registered: " + name);
    }
    const Entry& e = it->second;
    if (e.info.incarnation != incarnation) {
      ++refused_deregistrations;
      return reply_error(res, 400, "incarnation " + std::to_string(incarnation) + " is not the registered " +
                                       std::to_string(e.info.incarnation) + " of " + name + "; the entry is kept");
    }
    if (e.own_host && e.source != req.remote_addr) {
      ++refused_deregistrations;
      return reply_error(res, 400, "the entry of " + name + " was registered from " + e.source + "; a DELETE from " +
                                       req.remote_addr + " does not remove it");
    }
    if (--per_source[e.source] == 0) per_source.erase(e.source);
    log_event(LogLevel::kInfo, "bootstrap",
              "bootstrap entry of " + name + " removed: its rank left (incarnation " + std::to_string(incarnation) + ")",
              {.extra = {{"event", "entry_removed"}}});
    ranks.erase(it);
    ++deregistrations;
    forget_departed(key);
    if (departed.size() >= kMaxDepartedRanks) forget_departed(departed_order.begin()->second);
    departed[key] = {incarnation, ++departures};
    departed_order[departures] = key;
    reply(res, 200, {{"ok", true}});
  }

  void handle_health(httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    reply(res, 200, {{"ok", true}, {"ranks", ranks.size()}});
  }

  // Wraps a handler: with the secret, the request's MAC is checked first (its body read by now;
  // core/http_auth.h), and nothing escapes into httplib.
  template <typename F>
  httplib::Server::Handler guarded(F f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      try {
        if (!security::check_request_mac(verifier.get(), req, res)) return;
        f(req, res);
      } catch (const std::exception& e) {
        reply_error(res, 500, std::string("internal error: ") + e.what());
      } catch (...) {
        reply_error(res, 500, "internal error");
      }
    };
  }

  void install() {
    http.new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
    http.set_payload_max_length(kMaxBodyBytes);
    http.set_read_timeout(kReadTimeoutS, 0);
    http.set_keep_alive_timeout(kKeepAliveS);
    // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
    // silently take half the registrations. Reuse TIME_WAIT addresses only.
    http.set_socket_options([](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    http.Put("/route", guarded([this](const auto& req, auto& res) { handle_put(req, res); }));
    http.Get("/route", guarded([this](const auto& req, auto& res) { handle_get(req, res); }));
    http.Delete("/route", guarded([this](const auto& req, auto& res) { handle_delete(req, res); }));
    http.Get("/health", guarded([this](const auto&, auto& res) { handle_health(res); }));
    http.Post("/register_dp_rank", guarded([this](const auto& req, auto& res) {
      auto j = parse(req.body);
      if (j.is_discarded()) return reply_error(res, 400, "body: invalid JSON");
      send(res, sglang.register_dp_rank(j, monotonic_ns()));
    }));
    http.Post("/query_dp_ranks", guarded([this](const auto& req, auto& res) {
      auto j = parse(req.body);
      if (j.is_discarded()) return reply_error(res, 400, "body: invalid JSON");
      send(res, sglang.query_dp_ranks(j, monotonic_ns()));
    }));
    http.Post("/failure", guarded([this](const auto& req, auto& res) {
      auto j = parse(req.body);
      if (j.is_discarded()) return reply_error(res, 400, "body: invalid JSON");
      send(res, failures.post(j, req.remote_addr, monotonic_ns(), realtime_ns()));
    }));
    http.Get("/failure", guarded([this](const auto& req, auto& res) {
      std::string room;
      const bool has = req.has_param("room");
      if (has) room = req.get_param_value("room");
      send(res, failures.get(has ? &room : nullptr, monotonic_ns()));
    }));
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (res.body.empty()) {
        reply_error(res, res.status,
                    "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path);
      }
    });
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          reply_error(res, 500, "internal error");
        });
  }
};

BootstrapServer::BootstrapServer() : impl_(std::make_unique<Impl>()) {}

BootstrapServer::~BootstrapServer() {
  if (!impl_->thread.joinable()) return;
  // stop() only acts on a running accept loop: wait for it to run (or to have failed), stop once.
  while (!impl_->listen_returned) {
    if (impl_->http.is_running()) {
      impl_->http.stop();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->thread.join();
}

Result<std::unique_ptr<BootstrapServer>> BootstrapServer::start(const std::string& host,
                                                                uint16_t port) {
  ListenAddress a;
  a.bind_host = host;
  a.port = port;
  return start(a);
}

Result<std::unique_ptr<BootstrapServer>> BootstrapServer::start(const ListenAddress& address) {
  auto keys = security::cluster_keys();
  if (!keys.ok()) return Status(keys.status().code(), "bootstrap: " + keys.status().message());
  return start(address, *keys);
}

Result<std::unique_ptr<BootstrapServer>> BootstrapServer::start(const ListenAddress& address,
                                                                const security::ClusterKeys* keys) {
  auto host = parse_host(address.bind_host);
  if (!host.ok()) return Status(host.status().code(), "bootstrap: bind host: " + host.status().message());
  if (!address.advertise_host.empty()) {
    auto adv = parse_host(address.advertise_host, /*allow_wildcard=*/false);
    if (!adv.ok()) return Status(adv.status().code(), "bootstrap: advertise host: " + adv.status().message());
  }
  const uint16_t port = address.port;
  std::unique_ptr<BootstrapServer> s(new BootstrapServer());
  Impl& impl = *s->impl_;
  impl.advertised = address.advertised();
  try {
    if (keys) impl.verifier = std::make_unique<security::RequestVerifier>(*keys);
    impl.install();
    security::require_request_mac(impl.http, impl.verifier.get());
    // "*" and "" listen on IPv6 and IPv4 ("::"), or on IPv4 only where IPv6 is off.
    std::vector<std::string> hosts{bind_host_for_socket(*host)};
    if (host->empty() || *host == "*") hosts.push_back("0.0.0.0");
    int bound = -1;
    for (const std::string& h : hosts) {
      if (port == 0) {
        bound = impl.http.bind_to_any_port(h);
      } else if (impl.http.bind_to_port(h, port)) {
        bound = port;
      }
      if (bound > 0) break;
    }
    if (bound <= 0) {
      return Status(ErrorCode::kInternal, "bootstrap: cannot bind " + host_port(*host, port));
    }
    impl.port = static_cast<uint16_t>(bound);
    impl.thread = std::thread([&impl] {
      impl.http.listen_after_bind();
      impl.listen_returned = true;
    });
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInternal, std::string("bootstrap: cannot start: ") + e.what());
  }
  // stop() is a no-op until the accept loop runs, so wait for it before handing the server out.
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (!impl.http.is_running()) {
    if (impl.listen_returned || std::chrono::steady_clock::now() > deadline) {
      return Status(ErrorCode::kInternal, "bootstrap: HTTP server on port " +
                                              std::to_string(impl.port) + " did not start");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return s;
}

uint16_t BootstrapServer::port() const { return impl_->port; }

std::string BootstrapServer::address() const { return host_port(impl_->advertised, impl_->port); }

uint64_t BootstrapServer::overwrites() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->overwrites;
}

uint64_t BootstrapServer::refused_overwrites() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->refused_overwrites;
}

uint64_t BootstrapServer::deregistrations() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->deregistrations;
}

uint64_t BootstrapServer::refused_deregistrations() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->refused_deregistrations;
}

uint64_t BootstrapServer::lookups() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->lookups;
}

size_t BootstrapServer::registered() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ranks.size() + impl_->sglang.registered();
}

}  // namespace kvferry
