// A serving engine's use of an installed kvferry, through its public headers only (CTest
// `install_consumer`, tests/consumer/run.cmake). For each transport (shm, tcp) it starts a bootstrap
// service in-process, a prefill Manager and a decode Manager over buffers this program owns, shaped
// as an engine's (6 KV buffers: 3 layers of K and V; 2 aux buffers; 1 state buffer), and runs each
// engine's side of a room on its own thread:
//   room 1: prefill sends 5 pages in two chunks and an empty last chunk carrying the state row;
//           every byte of the destination pages, aux rows and state row must equal the source's,
//           and every other byte of decode's buffers must still be zero;
//   room 2: prefill's writes fail (the fault decorator); prefill must record transfer_error as the
//           origin, decode the same failure from another rank, and both become release-safe.
// Prints "consumer ok: ..." and exits 0 when every check holds; otherwise names the first failure.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/bootstrap.h"
#include "kvferry/buffers.h"
#include "kvferry/error.h"
#include "kvferry/fault_transport.h"
#include "kvferry/manager.h"
#include "kvferry/poll.h"

namespace {

using namespace kvferry;
using Clock = std::chrono::steady_clock;

// 3 layers of K and V, 2 KV heads of 16 bf16 values, pages of 4 tokens: 256-byte pages.
const ModelGeometry kModel{"consumer-tiny", "GQA", 3, 2, 2, 16, 2};
constexpr uint32_t kPageSize = 4;
constexpr uint64_t kPageBytes = uint64_t{kPageSize} * 2 * 16 * 2;
constexpr uint64_t kPages = 12;
constexpr uint64_t kAuxRows = 8;
constexpr uint64_t kAuxItem[2] = {8, 48};  // e.g. first token + cached tokens; logprobs
constexpr uint64_t kStateRows = 4;
constexpr uint64_t kStateItem = 96;
constexpr auto kDeadline = std::chrono::seconds(30);

// The room of the good transfer: source pages, destination pages, aux and state rows.
const std::vector<uint64_t> kSrcPages = {3, 7, 1, 9, 4};
const std::vector<uint64_t> kDstPages = {10, 0, 5, 6, 2};
constexpr uint64_t kSrcAux = 5, kDstAux = 3;
const std::vector<uint64_t> kSrcState = {2};
const std::vector<uint64_t> kDstState = {1};

// One engine's memory: separately allocated buffers, as an engine's allocator hands them out.
struct EngineBuffers {
  std::vector<std::vector<uint8_t>> kv, aux, state;
  EngineBuffers() {
    for (uint32_t i = 0; i < kModel.num_layers * kModel.tensors_per_layer; ++i) kv.emplace_back(kPages * kPageBytes);
    for (uint64_t item : kAuxItem) aux.emplace_back(kAuxRows * item);
    state.emplace_back(kStateRows * kStateItem);
  }
  std::vector<BufferDesc> descs() {
    std::vector<BufferDesc> d;
    auto add = [&](std::vector<uint8_t>& b, uint64_t item, BufferKind kind) {
      d.push_back({reinterpret_cast<uint64_t>(b.data()), b.size(), item, kind, MemoryKind::kHost});
    };
    for (auto& b : kv) add(b, kPageBytes, BufferKind::kKv);
    for (size_t i = 0; i < aux.size(); ++i) add(aux[i], kAuxItem[i], BufferKind::kAux);
    for (auto& b : state) add(b, kStateItem, BufferKind::kState);
    return d;
  }
  // A byte pattern no two (buffer, offset) pairs of one transport share.
  void fill(uint8_t seed) {
    uint32_t n = seed;
    for (auto* group : {&kv, &aux, &state}) {
      for (auto& b : *group) {
        for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>((n * 131u + i * 7u + (i >> 8)) | 1u);
        ++n;
      }
    }
  }
};

std::string failure_str(const std::optional<KVTransferError>& e) { return e ? e->str() : "no failure record"; }

// Polls until the state is `want` (or Failed, or a later state), within the deadline.
template <class Room>
KVPoll wait_state(const Room& r, KVPoll want) {
  const auto until = Clock::now() + kDeadline;
  KVPoll p = r.poll();
  while (p != KVPoll::Failed && static_cast<int>(p) < static_cast<int>(want) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // an engine's step
    p = r.poll();
  }
  return p;
}

template <class Room>
bool wait_release_safe(const Room& r) {
  const auto until = Clock::now() + kDeadline;
  while (!r.release_safe() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return r.release_safe();
}

// Bytes `n` at `a` and `b` are equal; else a message naming the first difference.
std::string compare(const char* what, size_t index, const uint8_t* a, const uint8_t* b, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) {
      return std::string(what) + " " + std::to_string(index) + ": byte " + std::to_string(i) + " is " +
             std::to_string(b[i]) + ", expected " + std::to_string(a[i]);
    }
  }
  return {};
}

bool all_zero(const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

// Every destination byte equals its source; every byte decode did not offer is still zero.
std::string verify(const EngineBuffers& pre, const EngineBuffers& dec) {
  for (size_t b = 0; b < dec.kv.size(); ++b) {
    for (uint64_t page = 0; page < kPages; ++page) {
      const uint8_t* got = dec.kv[b].data() + page * kPageBytes;
      size_t i = 0;
      while (i < kDstPages.size() && kDstPages[i] != page) ++i;
      if (i == kDstPages.size()) {
        if (!all_zero(got, kPageBytes))
          return "KV buffer " + std::to_string(b) + " page " + std::to_string(page) + " was written";
        continue;
      }
      std::string e = compare("KV buffer", b, pre.kv[b].data() + kSrcPages[i] * kPageBytes, got, kPageBytes);
      if (!e.empty()) return e + " (page " + std::to_string(page) + ")";
    }
  }
  for (size_t a = 0; a < dec.aux.size(); ++a) {
    const uint64_t item = kAuxItem[a];
    for (uint64_t row = 0; row < kAuxRows; ++row) {
      const uint8_t* got = dec.aux[a].data() + row * item;
      if (row != kDstAux) {
        if (!all_zero(got, item)) return "aux buffer " + std::to_string(a) + " row " + std::to_string(row) + " was written";
        continue;
      }
      std::string e = compare("aux buffer", a, pre.aux[a].data() + kSrcAux * item, got, item);
      if (!e.empty()) return e;
    }
  }
  for (uint64_t row = 0; row < kStateRows; ++row) {
    const uint8_t* got = dec.state[0].data() + row * kStateItem;
    if (row != kDstState[0]) {
      if (!all_zero(got, kStateItem)) return "state row " + std::to_string(row) + " was written";
      continue;
    }
    std::string e = compare("state buffer", 0, pre.state[0].data() + kSrcState[0] * kStateItem, got, kStateItem);
    if (!e.empty()) return e;
  }
  return {};
}

// Prefill's engine: room `room` in chunks (3 pages, 2 pages, then an empty last chunk with the
// state row), once decode's metadata is in (WaitingForInput). `inject`: its writes fail.
std::string prefill_side(Manager& mgr, uint64_t room, bool inject) {
  auto s = mgr.sender(room);
  if (!s.ok()) return "sender: " + s.status().str();
  Sender& snd = **s;
  if (inject) mgr.faults()->fail_room(room, ErrorCode::kTransferError, "consumer: write failure injected");
  if (Status st = snd.init(kSrcPages.size(), kSrcAux); !st.ok()) return "sender init: " + st.str();
  if (KVPoll p = wait_state(snd, KVPoll::WaitingForInput); p != KVPoll::WaitingForInput)
    return std::string("sender before send: ") + std::string(to_string(p));
  const std::span<const uint64_t> pages(kSrcPages);
  if (Status st = snd.send(pages.subspan(0, 3), {}, false); !st.ok()) return "send 1: " + st.str();
  if (Status st = snd.send(pages.subspan(3), {}, false); !st.ok() && !inject) return "send 2: " + st.str();
  if (Status st = snd.send({}, kSrcState, true); !st.ok() && !inject) return "last send: " + st.str();
  const KVPoll want = inject ? KVPoll::Failed : KVPoll::Success;
  if (KVPoll p = wait_state(snd, KVPoll::Success); p != want)
    return "sender ended " + std::string(to_string(p)) + ": " + failure_str(snd.failure());
  if (inject) {
    auto f = snd.failure();
    if (!f || f->code != ErrorCode::kTransferError || f->origin != mgr.self() || f->is_from_another_rank ||
        f->bootstrap_room != room)
      return "prefill's failure record: " + failure_str(f);
  } else if (snd.metrics().bytes == 0) {
    return "sender metrics: no bytes";
  }
  if (!wait_release_safe(snd)) return "sender never release-safe";
  return {};
}

// Decode's engine: offers pages, aux row and state row, waits for the room's end.
std::string decode_side(Manager& mgr, uint64_t room, const std::string& bootstrap, const RankId& prefill,
                        bool inject) {
  auto r = mgr.receiver(room, bootstrap);
  if (!r.ok()) return "receiver: " + r.status().str();
  Receiver& rcv = **r;
  if (Status st = rcv.init(); !st.ok()) return "receiver init: " + st.str();
  if (Status st = rcv.send_metadata(kDstPages, kDstAux, kDstState); !st.ok()) return "send_metadata: " + st.str();
  const KVPoll want = inject ? KVPoll::Failed : KVPoll::Success;
  if (KVPoll p = wait_state(rcv, KVPoll::Success); p != want)
    return "receiver ended " + std::string(to_string(p)) + ": " + failure_str(rcv.failure());
  if (inject) {
    auto f = rcv.failure();
    if (!f || f->code != ErrorCode::kTransferError || f->origin != prefill || !f->is_from_another_rank ||
        f->bootstrap_room != room)
      return "decode's failure record: " + failure_str(f);
    if (rcv.failure()->failure_reason != f->failure_reason) return "failure() is not stable";
  }
  if (!wait_release_safe(rcv)) return "receiver never release-safe";
  if (rcv.quarantined()) return "receiver quarantined its pages";
  return {};
}

// Both engines' sides of one room, each on its own thread.
std::string run_room(Manager& pre, Manager& dec, uint64_t room, const std::string& bootstrap, bool inject) {
  std::string pe, de;
  std::thread p([&] { pe = prefill_side(pre, room, inject); });
  std::thread d([&] { de = decode_side(dec, room, bootstrap, pre.self(), inject); });
  p.join();
  d.join();
  if (!pe.empty()) return "prefill: " + pe;
  if (!de.empty()) return "decode: " + de;
  return {};
}

std::string run_transport(const std::string& transport, uint8_t seed) {
  auto server = BootstrapServer::start("127.0.0.1", 0);
  if (!server.ok()) return "bootstrap: " + server.status().str();
  const std::string bootstrap = "127.0.0.1:" + std::to_string((*server)->port());
  EngineBuffers pre_mem, dec_mem;
  pre_mem.fill(seed);

  auto config = [&](Role role, EngineBuffers& mem) {
    ManagerConfig c;
    c.self = RankId{role, 0, 0, 0};
    c.model = kModel;
    c.page_size = kPageSize;
    c.buffers = mem.descs();
    c.bootstrap_address = bootstrap;
    c.transport = transport;
    c.fault_injection = role == Role::kPrefill;
    return c;
  };
  auto pre = Manager::create(config(Role::kPrefill, pre_mem));
  if (!pre.ok()) return "prefill manager: " + pre.status().str();
  auto dec = Manager::create(config(Role::kDecode, dec_mem));
  if (!dec.ok()) return "decode manager: " + dec.status().str();
  if ((*pre)->faults() == nullptr) return "prefill manager has no fault decorator";
  if ((*dec)->faults() != nullptr) return "decode manager has a fault decorator it was not asked for";

  if (std::string e = run_room(**pre, **dec, 1, bootstrap, false); !e.empty()) return "room 1: " + e;
  if (std::string e = verify(pre_mem, dec_mem); !e.empty()) return "room 1: " + e;
  if (std::string e = run_room(**pre, **dec, 2, bootstrap, true); !e.empty()) return "room 2: " + e;
  dec->reset();  // decode first, then prefill: the managers go before the buffers they registered
  pre->reset();
  return {};
}

}  // namespace

int main() {
  std::string summary;
  uint8_t seed = 1;
  for (const char* transport : {"shm", "tcp"}) {
    if (std::string e = run_transport(transport, seed++); !e.empty()) {
      std::fprintf(stderr, "consumer: %s: %s\n", transport, e.c_str());
      return 1;
    }
    summary += std::string(summary.empty() ? "" : ", ") + transport + " room moved and failed";
  }
  std::printf("consumer ok: %s (%zu pages x %u KV buffers, 2 aux buffers, 1 state buffer)\n", summary.c_str(),
              kSrcPages.size(), kModel.num_layers * kModel.tensors_per_layer);
  return 0;
}
