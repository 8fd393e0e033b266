// The attacked cluster of tests/integration/hostile_peer_test.cc (docs/security.md, "Tests"): a
// bootstrap service, a real prefill rank (engine 0, TP 1, serving a decode engine of DP 2) and a
// real decode rank (DP group 0), each a caller-pumped kvferry::Manager over the tcp transport
// whose engine buffers live inside one allocation with canary bytes before, between and after
// them; and the liar, which holds sockets of its own (a ZeroMQ control socket without the cluster's
// keys, optionally a UCX transport with a real region) and speaks kvferry's wire formats: frames
// built with the library's own encoders (kvferry/messages.h) and then altered.
//
// The liar plays decode DP group 1 (rooms with room % 2 == 1 are its rooms: the prefill rank writes
// them to it), so an honest room (even id, decode DP group 0) never involves it. What it sends is
// marked by small incarnations (< kLiarIncarnationLimit; real ones are CLOCK_REALTIME ns), which is
// how the ranks' message hooks count liar frames that were parsed.
// Thread contract: the test thread only (the managers are caller-pumped).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/secret.h"
#include "kvferry/bootstrap.h"
#include "kvferry/control.h"
#include "kvferry/log.h"
#include "kvferry/manager.h"
#include "kvferry/messages.h"
#include "kvferry/transport.h"
#include "manager/manager_internal.h"

namespace kvferry_itest {

using namespace kvferry;
using namespace std::chrono_literals;

constexpr uint64_t kLiarIncarnationLimit = 1'000'000;
constexpr uint64_t kCanaryBytes = 4096;
constexpr uint64_t kPages = 16;       // per KV buffer, both ranks
constexpr uint64_t kAuxRows = 16;
constexpr uint64_t kAuxItemBytes = 32;
constexpr uint64_t kRoomPages = 3;    // pages of a test room

inline ModelGeometry tiny_model() {
  ModelGeometry m;
  m.name = "hostile-tiny";
  m.attention = "GQA";
  m.num_layers = 2;
  m.tensors_per_layer = 2;
  m.cache_heads = 4;
  m.head_dim = 16;
  m.dtype_bytes = 2;
  return m;
}
constexpr uint32_t kPageSize = 4;
constexpr uint64_t kPageBytes = kPageSize * 4 * 16 * 2;  // tokens x heads x head_dim x dtype

inline uint8_t canary_byte(size_t i) { return static_cast<uint8_t>(0xA5 ^ (i * 131)); }

// One rank's engine memory: 4 KV buffers and one aux buffer, each between canary regions.
struct CanaryMemory {
  std::vector<uint8_t> bytes;
  std::vector<std::pair<size_t, size_t>> buffers;  // (offset, length) inside `bytes`
  std::vector<BufferDesc> descs;

  explicit CanaryMemory(uint8_t seed) {
    std::vector<std::pair<uint64_t, BufferKind>> sizes(4, {kPages * kPageBytes, BufferKind::kKv});
    sizes.push_back({kAuxRows * kAuxItemBytes, BufferKind::kAux});
    size_t total = kCanaryBytes;
    for (auto& [len, kind] : sizes) total += len + kCanaryBytes;
    bytes.resize(total);
    for (size_t i = 0; i < total; ++i) bytes[i] = canary_byte(i);
    size_t at = kCanaryBytes;
    for (auto& [len, kind] : sizes) {
      buffers.push_back({at, len});
      for (size_t i = 0; i < len; ++i) bytes[at + i] = static_cast<uint8_t>(seed + i * 7);
      descs.push_back({reinterpret_cast<uint64_t>(bytes.data() + at), len,
                       kind == BufferKind::kKv ? kPageBytes : kAuxItemBytes, kind, MemoryKind::kHost});
      at += len + kCanaryBytes;
    }
  }
  uint8_t* kv_page(size_t buffer, uint64_t page) { return bytes.data() + buffers[buffer].first + page * kPageBytes; }
  // Canary bytes that changed (0: nothing was written outside the buffers).
  size_t damaged_canary() const {
    size_t bad = 0, b = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
      while (b < buffers.size() && i >= buffers[b].first + buffers[b].second) ++b;
      const bool inside = b < buffers.size() && i >= buffers[b].first;
      if (!inside && bytes[i] != canary_byte(i)) ++bad;
    }
    return bad;
  }
};

// Every log line of the process (debug included), to assert on the refusals the code logs.
class LogCapture {
 public:
  LogCapture() {
    set_log_callback([this](LogLevel, std::string_view comp, std::string_view msg, const LogFields&) {
      std::lock_guard l(mu_);
      lines_.push_back(std::string(comp) + ": " + std::string(msg));
    }, LogLevel::kDebug);
  }
  ~LogCapture() { set_log_callback({}); }
  size_t count(std::string_view needle) const {
    std::lock_guard l(mu_);
    return std::count_if(lines_.begin(), lines_.end(), [&](const std::string& s) { return s.find(needle) != s.npos; });
  }
  std::string matching(std::string_view needle) const {
    std::lock_guard l(mu_);
    std::string out;
    for (const auto& s : lines_)
      if (s.find(needle) != s.npos) out += s + "\n";
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// The liar: a control socket without the cluster's keys, and (for the cases that need the
// prefill rank to connect to it) a UCX tcp transport with a real region.
struct Liar {
  RankId self{Role::kDecode, 0, 0, 1};
  std::unique_ptr<ControlSocket> control;
  std::unique_ptr<Transport> transport;
  LocalRegion region;
  uint64_t incarnation = 7;
  std::vector<Message> received;  // frames the attacked ranks sent it, decoded
  std::chrono::steady_clock::time_point last_heartbeat{};

  static std::unique_ptr<Liar> create() {
    auto l = std::make_unique<Liar>();
    ListenAddress a;
    a.bind_host = "127.0.0.1";
    auto s = ControlSocket::bind(a, nullptr);  // never the cluster's keys
    if (!s.ok()) return nullptr;
    l->control = std::move(s).value();
    return l;
  }
  // A real region of `bytes` (tcp): what a registration may then lie about.
  Status make_region(uint64_t bytes) {
    auto t = make_transport("tcp");
    if (!t.ok()) return t.status();
    transport = std::move(t).value();
    auto r = transport->create_region(bytes);
    if (!r.ok()) return r.status();
    region = *r;
    return Status::Ok();
  }
  Status send(const std::string& to, Message m) {
    std::visit([&](auto& x) { if (x.incarnation == 0) x.incarnation = incarnation; }, m);
    return control->send(to, encode(m));
  }
  Status send_raw(const std::string& to, const std::string& frame) { return control->send(to, frame); }
  void drain() {
    while (auto f = control->recv(0ms)) {
      auto m = decode(*f);
      if (m.ok()) received.push_back(std::move(*m));
    }
  }
  template <class T>
  size_t received_count() const {
    return std::count_if(received.begin(), received.end(), [](const Message& m) { return std::holds_alternative<T>(m); });
  }
};

// A registration of the liar's pool shaped like the honest decode rank's (same KV buffers, aux
// item sizes, heads): KV buffers back to back from offset 0, then the aux buffer, then the guard
// rows, in one span of `span_bytes` at the liar region's base (0: exactly what the shape needs).
inline PoolRegistration liar_registration(const PoolRegistration& honest, const Liar& liar, uint64_t num_pages,
                                          uint64_t span_bytes = 0) {
  PoolRegistration r = honest;
  r.sender = liar.self;
  r.control_endpoint = liar.control->endpoint();
  r.worker_address = liar.transport ? liar.transport->address() : std::string(64, '\x5a');
  r.num_pages = num_pages;
  r.kv_offsets.clear();
  uint64_t at = 0;
  for (size_t b = 0; b < honest.kv_offsets.size(); ++b, at += num_pages * r.page_bytes) r.kv_offsets.push_back(at);
  r.aux_offsets = {at};
  at += r.aux_rows * r.aux_item_bytes.at(0);
  r.guard_offset = at;
  at += r.aux_rows * kAuxSlotBytes;
  const uint64_t base = liar.transport ? reinterpret_cast<uint64_t>(liar.region.base) : 0x10000;
  r.spans = {RegionSpan{0, span_bytes ? span_bytes : at, base, liar.transport ? liar.region.packed_rkey : "k"}};
  r.incarnation = liar.incarnation;
  return r;
}
inline uint64_t registration_bytes(const PoolRegistration& r) {
  return r.guard_offset + r.aux_rows * kAuxSlotBytes;
}

// The attacked ranks.
class Cluster {
 public:
  CanaryMemory pmem{1}, dmem{101};
  std::unique_ptr<BootstrapServer> bootstrap;
  std::unique_ptr<Manager> prefill, decode;
  std::optional<PoolRegistration> honest_registration;  // the decode rank's, as the prefill rank got it
  uint64_t liar_frames_at_prefill = 0, liar_frames_at_decode = 0;  // parsed (message hooks)
  std::unique_ptr<Liar> liar;

  Status start() {
    ListenAddress a;
    a.bind_host = "127.0.0.1";
    auto srv = BootstrapServer::start(a);
    if (!srv.ok()) return srv.status();
    bootstrap = std::move(srv).value();
    ManagerConfig pc = config({Role::kPrefill, 0, 0, 0}, pmem);
    pc.peer_dp_size = 2;
    auto p = Manager::create(pc);
    if (!p.ok()) return p.status();
    prefill = std::move(p).value();
    internal(*prefill).set_message_hook([this](const Message& m) {
      if (incarnation_of(m) < kLiarIncarnationLimit) ++liar_frames_at_prefill;
      if (auto* r = std::get_if<PoolRegistration>(&m); r && r->sender == RankId{Role::kDecode, 0, 0, 0} &&
                                                     r->incarnation >= kLiarIncarnationLimit)
        honest_registration = *r;
    });
    ManagerConfig dc = config({Role::kDecode, 0, 0, 0}, dmem);
    auto d = Manager::create(dc);
    if (!d.ok()) return d.status();
    decode = std::move(d).value();
    internal(*decode).set_message_hook([this](const Message& m) {
      if (incarnation_of(m) < kLiarIncarnationLimit) ++liar_frames_at_decode;
    });
    liar = Liar::create();
    if (!liar) return Status(ErrorCode::kInternal, "the liar's control socket did not bind");
    // The decode rank looked the prefill up (create) and registered its pool there.
    if (!pump_until([&] { return honest_registration.has_value() && prefill->stats().peers == 1; }))
      return Status(ErrorCode::kInternal, "the decode rank's registration never reached the prefill rank");
    return Status::Ok();
  }

  static uint64_t incarnation_of(const Message& m) {
    return std::visit([](const auto& x) { return x.incarnation; }, m);
  }

  PrefillEndpoint& pe() { return *internal(*prefill).prefill(); }
  DecodeEndpoint& de() { return *internal(*decode).decode(); }
  EndpointCore& pcore() { return internal(*prefill).core(); }
  EndpointCore& dcore() { return internal(*decode).core(); }

  // One round of every side's progress (the liar answers nothing but keeps its heartbeat, so the
  // prefill rank does not take it for dead while a case runs).
  void pump() {
    prefill->progress();
    decode->progress();
    if (liar) {
      liar->drain();
      if (liar_registered && std::chrono::steady_clock::now() - liar->last_heartbeat > 100ms) {
        (void)liar->send(prefill->control_endpoint(), Heartbeat{liar->self, 0, monotonic_ns(), 0});
        liar->last_heartbeat = std::chrono::steady_clock::now();
      }
    }
    std::vector<int> fds = prefill->wait_fds();
    for (int fd : decode->wait_fds()) fds.push_back(fd);
    wait_readable(fds.data(), static_cast<int>(fds.size()), 1);
  }
  // Generous: the machine is shared with other suites.
  bool pump_until(const std::function<bool()>& pred, std::chrono::milliseconds limit = 60s) {
    for (auto end = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < end;) {
      pump();
      if (pred()) return true;
    }
    return pred();
  }
  // Pumps for at least `d` (only to let frames that should NOT arrive have every chance to).
  void pump_for(std::chrono::milliseconds d) {
    pump_until([] { return false; }, d);
  }
  bool liar_registered = false;  // the liar keeps its heartbeat going
  std::string transport = "tcp";  // both ranks' (set before start(); hostile_rkey_test: "shm")

  // An honest room (even id: decode DP group 0): kRoomPages pages, byte-exact at the decode rank.
  // Returns "" or what went wrong.
  std::string honest_room(uint64_t room) {
    if (room % 2 != 0) return "not an honest room id";
    const std::vector<uint64_t> src{room % 5, 5 + room % 3, 9}, dst{(room / 2) % 4, 6, 11 + room % 4};
    for (size_t b = 0; b < 4; ++b)
      for (uint64_t p : src) std::memset(pmem.kv_page(b, p), static_cast<int>(room * 3 + b + p), kPageBytes);
    auto rx = decode->receiver(room, bootstrap->address());
    if (!rx.ok()) return "receiver: " + rx.status().str();
    auto tx = prefill->sender(room);
    if (!tx.ok()) return "sender: " + tx.status().str();
    if (Status s = (*rx)->init(); !s.ok()) return s.str();
    if (Status s = (*rx)->send_metadata(dst, room % kAuxRows, {}); !s.ok()) return s.str();
    if (Status s = (*tx)->init(kRoomPages, 1); !s.ok()) return s.str();
    if (!pump_until([&] { return (*tx)->poll() != KVPoll::Bootstrapping; })) return "prefill stuck Bootstrapping";
    if ((*tx)->poll() != KVPoll::WaitingForInput) return "prefill " + std::string(to_string((*tx)->poll()));
    if (Status s = (*tx)->send(src, {}, true); !s.ok()) return s.str();
    if (!pump_until([&] { return (*tx)->poll() == KVPoll::Success && (*rx)->poll() == KVPoll::Success; })) {
      std::string why = fmt_room(*tx, *rx);
      return "not Success on both ranks: " + why;
    }
    for (size_t b = 0; b < 4; ++b)
      for (size_t i = 0; i < src.size(); ++i)
        if (std::memcmp(pmem.kv_page(b, src[i]), dmem.kv_page(b, dst[i]), kPageBytes) != 0)
          return "page " + std::to_string(dst[i]) + " of buffer " + std::to_string(b) + " differs";
    if (!pump_until([&] { return (*rx)->release_safe() && (*tx)->release_safe(); })) return "never release-safe";
    return "";
  }

  static std::string fmt_room(const std::unique_ptr<Sender>& tx, const std::unique_ptr<Receiver>& rx) {
    std::string s = "prefill " + std::string(to_string(tx->poll())) + ", decode " + std::string(to_string(rx->poll()));
    if (auto f = tx->failure()) s += "; prefill: " + f->failure().describe();
    if (auto f = rx->failure()) s += "; decode: " + f->failure().describe();
    return s;
  }

 private:
  ManagerConfig config(const RankId& self, CanaryMemory& mem) {
    ManagerConfig c;
    c.self = self;
    c.model = tiny_model();
    c.page_size = kPageSize;
    c.buffers = mem.descs;
    c.control.bind_host = "127.0.0.1";
    c.transport = transport;
    c.progress_thread = false;
    c.deadlines.heartbeat_timeout_ms = 10000;  // a loaded host may leave the pump idle a while
    c.deadlines.connect_timeout_ms = 10000;
    c.bootstrap_address = bootstrap->address();
    return c;
  }
};

}  // namespace kvferry_itest
