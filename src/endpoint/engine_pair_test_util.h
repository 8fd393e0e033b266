// Test-only harness for engine-shaped memory (kvferry/buffers.h): prefill ranks and decode ranks
// (any TP sizes, DP 1) in ONE process, each with its own KV, aux and state buffers as separate
// buffers (in one arena per rank, in an order unlike the layer order, with gaps between them),
// kvferry's guard rows among them, connected for real (bootstrap service, ZeroMQ, UCX shm).
// The test thread plays every rank's main loop (pump()).
//
// Header-only, next to endpoint_pair_test_util.h (the contiguous-pool pair).
// Thread contract: the test thread only.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/core.h"
#include "endpoint/decode_endpoint.h"
#include "endpoint/prefill_endpoint.h"
#include "endpoint/topology.h"
#include "kvferry/bootstrap.h"
#include "kvferry/buffers.h"
#include "kvferry/content.h"
#include "kvferry/messages.h"

namespace kvferry::testing {

// Small models: GQA with 4 KV heads (3 layers: 6 KV buffers) and MLA (2 layers: 2 KV buffers).
inline ModelGeometry toy_gqa() { return {"toy-gqa", "GQA", 3, 2, 4, 16, 2}; }
inline ModelGeometry toy_mla() { return {"toy-mla", "MLA", 2, 1, 1, 32, 2}; }

struct EngineSpec {
  ModelGeometry model = toy_gqa();
  uint32_t page_size = 4;
  uint64_t pages = 16;
  std::vector<uint64_t> aux_item_bytes{8, 24};
  uint64_t aux_rows = 8;
  std::vector<uint64_t> state_item_bytes{40};
  uint64_t state_rows = 4;
};

struct EngineRank {
  RankId self;
  PoolLayout layout;
  std::vector<uint8_t> arena;
  std::vector<BufferDesc> buffers;
  uint8_t* guard = nullptr;  // kvferry's guard rows, in the arena
  std::unique_ptr<EndpointCore> core;
  std::unique_ptr<PrefillEndpoint> prefill;
  std::unique_ptr<DecodeEndpoint> decode;
};

// Carves the rank's buffers out of its arena: state buffers, aux buffers in reverse, KV buffers
// in reverse layer order, then the guard rows, 64-byte aligned with uneven gaps.
inline Status build_rank(EngineRank& r, const EngineSpec& s, Role role, uint32_t tp, uint32_t tp_rank,
                         const Deadlines& d) {
  r.self = {role, 0, tp_rank, 0};
  auto slice = head_slice(s.model, tp, tp_rank);
  if (!slice.ok()) return slice.status();
  PoolLayout probe;
  probe.model = s.model;
  probe.page_size = s.page_size;
  probe.heads_per_rank = slice->count;
  const uint64_t stripe = probe.page_bytes() * probe.num_buffers();
  auto l = make_layout(s.model, tp, tp_rank, s.page_size, stripe * s.pages + s.aux_rows * kAuxSlotBytes,
                       static_cast<uint32_t>(s.aux_rows));
  if (!l.ok()) return l.status();
  r.layout = *l;
  struct Piece {
    uint64_t bytes, item;
    BufferKind kind;
    size_t index;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < s.state_item_bytes.size(); ++i)
    pieces.push_back({s.state_item_bytes[i] * s.state_rows, s.state_item_bytes[i], BufferKind::kState, i});
  for (size_t i = s.aux_item_bytes.size(); i-- > 0;)
    pieces.push_back({s.aux_item_bytes[i] * s.aux_rows, s.aux_item_bytes[i], BufferKind::kAux, i});
  for (size_t i = r.layout.num_buffers(); i-- > 0;)
    pieces.push_back({r.layout.page_bytes() * s.pages, r.layout.page_bytes(), BufferKind::kKv, i});
  const uint64_t guard_bytes = s.aux_rows * kAuxSlotBytes;
  uint64_t total = 64;
  for (size_t i = 0; i < pieces.size(); ++i) total += (pieces[i].bytes + 63) / 64 * 64 + 64 * (1 + i % 3);
  total += guard_bytes + 64;
  r.arena.assign(total + 64, 0);
  uint64_t at = (64 - reinterpret_cast<uint64_t>(r.arena.data()) % 64) % 64 + 64;
  std::vector<BufferDesc> kv(r.layout.num_buffers()), aux(s.aux_item_bytes.size()), state(s.state_item_bytes.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    BufferDesc b{reinterpret_cast<uint64_t>(r.arena.data() + at), p.bytes, p.item, p.kind, MemoryKind::kHost};
    (p.kind == BufferKind::kKv ? kv : p.kind == BufferKind::kAux ? aux : state)[p.index] = b;
    at += (p.bytes + 63) / 64 * 64 + 64 * (1 + i % 3);
  }
  r.guard = r.arena.data() + at;
  // The engine lists its buffers by kind, each kind in order (kvferry/buffers.h).
  r.buffers = kv;
  r.buffers.insert(r.buffers.end(), aux.begin(), aux.end());
  r.buffers.insert(r.buffers.end(), state.begin(), state.end());
  EndpointConfig c;
  c.self = r.self;
  c.layout = r.layout;
  c.deadlines = d;
  c.buffers = r.buffers;
  c.guard_memory = r.guard;
  auto core = EndpointCore::create(c);
  if (!core.ok()) return core.status();
  r.core = std::move(core).value();
  r.layout = r.core->layout();
  return Status::Ok();
}

struct EnginePairConfig {
  EngineSpec prefill;
  EngineSpec decode;
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  Deadlines deadlines;
  bool wait_registered = true;  // create() waits until every prefill rank has its decode peers
};

class EnginePair {
 public:
  static Result<std::unique_ptr<EnginePair>> create(const EnginePairConfig& cfg) {
    std::unique_ptr<EnginePair> p(new EnginePair(cfg));
    auto server = BootstrapServer::start("127.0.0.1", 0);
    if (!server.ok()) return server.status();
    p->server_ = std::move(server).value();
    const std::string address = "127.0.0.1:" + std::to_string(p->server_->port());
    auto plan = plan_transfers(cfg.prefill.model, cfg.prefill_tp, cfg.decode_tp);
    if (!plan.ok()) return plan.status();
    p->plan_ = *plan;
    BootstrapClient client(address);
    for (uint32_t t = 0; t < cfg.prefill_tp; ++t) {
      auto r = std::make_unique<EngineRank>();
      Status s = build_rank(*r, cfg.prefill, Role::kPrefill, cfg.prefill_tp, t, cfg.deadlines);
      if (!s.ok()) return s;
      r->prefill = std::make_unique<PrefillEndpoint>(*r->core, p->plan_);
      PrefillRankInfo info;
      info.tp_rank = t;
      info.tp_size = cfg.prefill_tp;
      info.host = "127.0.0.1";
      info.control_endpoint = r->core->control_endpoint();
      info.page_size = cfg.prefill.page_size;
      info.dtype = "bfloat16";
      info.model = cfg.prefill.model.name;
      info.num_layers = cfg.prefill.model.num_layers;
      info.heads_per_rank = r->layout.heads_per_rank;
      info.first_head = r->layout.first_head;
      s = client.register_rank(info);
      if (!s.ok()) return s;
      p->prefill_.push_back(std::move(r));
    }
    for (uint32_t t = 0; t < cfg.decode_tp; ++t) {
      auto r = std::make_unique<EngineRank>();
      Status s = build_rank(*r, cfg.decode, Role::kDecode, cfg.decode_tp, t, cfg.deadlines);
      if (!s.ok()) return s;
      r->decode = std::make_unique<DecodeEndpoint>(*r->core, p->plan_, address);
      s = r->decode->connect_peers(client, monotonic_ns() + 5'000'000'000);
      if (!s.ok()) return s;
      p->decode_.push_back(std::move(r));
    }
    if (cfg.wait_registered) {
      auto all = [&] {
        for (uint32_t t = 0; t < cfg.prefill_tp; ++t)
          if (p->prefill_[t]->prefill->peers() != dests_of(p->plan_, t).size()) return false;
        return true;
      };
      if (!p->pump_until(all, std::chrono::seconds(5)))
        return Status(ErrorCode::kInternal, "the decode registrations never reached every prefill rank");
    }
    return p;
  }

  ~EnginePair() {
    // A prefill rank connects to a decode rank off its engine thread: let connects under way
    // finish before the ranks go, so none attaches to a peer already destroyed (UCX's shm
    // transport leaks on that path; seen once under ASan). Bounded: a test may hold a connect.
    pump_until(
        [&] {
          for (auto& r : prefill_)
            if (r->prefill && r->prefill->connecting_peers() != 0) return false;
          return true;
        },
        std::chrono::seconds(5));
    decode_.clear();
    prefill_.clear();
  }

  EngineRank& p(uint32_t t = 0) { return *prefill_[t]; }
  EngineRank& d(uint32_t t = 0) { return *decode_[t]; }
  size_t prefill_ranks() const { return prefill_.size(); }
  size_t decode_ranks() const { return decode_.size(); }
  const std::vector<HeadTransfer>& plan() const { return plan_; }

  void pump() {
    for (auto& r : prefill_) {
      while (auto f = r->core->control().recv(std::chrono::milliseconds(0))) {
        auto m = kvferry::decode(*f);
        if (m.ok()) r->prefill->on_message(*m);
      }
      for (const TransportEvent& e : r->core->take_events())
        if (auto done = r->prefill->on_transport_event(e)) chunks_done.push_back(*done);
      r->prefill->tick(monotonic_ns());
    }
    for (auto& r : decode_) {
      while (auto f = r->core->control().recv(std::chrono::milliseconds(0))) {
        auto m = kvferry::decode(*f);
        if (m.ok()) r->decode->on_message(*m);
      }
      (void)r->core->take_events();
      r->decode->tick(monotonic_ns());
    }
  }
  bool pump_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      pump();
      if (pred()) return true;
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // --- content ---
  // Fills prefill rank `t`'s local pages `pages` with the room's pages [first_page, ...).
  static void fill_kv(EngineRank& r, uint64_t room, uint64_t first_page, const std::vector<uint64_t>& pages) {
    for (size_t i = 0; i < pages.size(); ++i)
      for (uint32_t b = 0; b < r.layout.num_buffers(); ++b)
        fill_page(r.layout, room, b, (first_page + i) * r.layout.page_size, r.core->kv_page(b, pages[i]));
  }
  // Mismatched bytes of the room's pages at `kv` on a decode rank.
  static uint64_t verify_kv(const EngineRank& r, uint64_t room, const std::vector<uint64_t>& kv) {
    uint64_t bad = 0;
    for (size_t i = 0; i < kv.size(); ++i)
      for (uint32_t b = 0; b < r.layout.num_buffers(); ++b)
        bad += verify_page(r.layout, room, b, i * r.layout.page_size, r.core->kv_page(b, kv[i]));
    return bad;
  }
  static uint8_t row_byte(uint64_t room, size_t buffer, uint64_t j, size_t k) {
    return static_cast<uint8_t>(room * 131 + buffer * 31 + j * 7 + k + 1);
  }
  // Aux row `row` of every aux buffer of `r` with the room's pattern (or checks it: mismatches).
  static void fill_aux(EngineRank& r, uint64_t room, uint64_t row) {
    for (size_t a = 0; a < r.core->shape().aux_offsets.size(); ++a)
      for (size_t k = 0; k < r.core->shape().aux_item_bytes[a]; ++k) r.core->aux_row(a, row)[k] = row_byte(room, a, 0, k);
  }
  static uint64_t verify_aux(const EngineRank& r, uint64_t room, uint64_t row) {
    uint64_t bad = 0;
    for (size_t a = 0; a < r.core->shape().aux_offsets.size(); ++a)
      for (size_t k = 0; k < r.core->shape().aux_item_bytes[a]; ++k)
        bad += r.core->aux_row(a, row)[k] != row_byte(room, a, 0, k);
    return bad;
  }
  // State row rows[j] of every state buffer with the room's pattern for j (or checks it).
  static void fill_state(EngineRank& r, uint64_t room, const std::vector<uint64_t>& rows) {
    for (size_t s = 0; s < r.core->shape().state_offsets.size(); ++s)
      for (size_t j = 0; j < rows.size(); ++j)
        for (size_t k = 0; k < r.core->shape().state_item_bytes[s]; ++k)
          r.core->state_row(s, rows[j])[k] = row_byte(room, 100 + s, j, k);
  }
  static uint64_t verify_state(const EngineRank& r, uint64_t room, const std::vector<uint64_t>& rows) {
    uint64_t bad = 0;
    for (size_t s = 0; s < r.core->shape().state_offsets.size(); ++s)
      for (size_t j = 0; j < rows.size(); ++j)
        for (size_t k = 0; k < r.core->shape().state_item_bytes[s]; ++k)
          bad += r.core->state_row(s, rows[j])[k] != row_byte(room, 100 + s, j, k);
    return bad;
  }

  // The registration decode rank `r` sends (what send_registration builds), to tamper with.
  static PoolRegistration registration_of(const EngineRank& r) {
    const MemoryShape& sh = r.core->shape();
    PoolRegistration reg;
    reg.sender = r.self;
    reg.control_endpoint = r.core->control_endpoint();
    reg.worker_address = r.core->transport().address();
    reg.spans = r.core->spans();
    reg.page_size = sh.page_size;
    reg.page_bytes = sh.page_bytes;
    reg.num_pages = sh.num_pages;
    reg.kv_offsets = sh.kv_offsets;
    reg.aux_offsets = sh.aux_offsets;
    reg.aux_item_bytes = sh.aux_item_bytes;
    reg.aux_rows = sh.aux_rows;
    reg.state_offsets = sh.state_offsets;
    reg.state_item_bytes = sh.state_item_bytes;
    reg.state_rows = sh.state_rows;
    reg.guard_offset = sh.guard_offset;
    reg.heads_per_rank = r.layout.heads_per_rank;
    reg.first_head = r.layout.first_head;
    return reg;
  }

  std::vector<ChunkDone> chunks_done;

 private:
  explicit EnginePair(const EnginePairConfig& cfg) : cfg_(cfg) {}
  EnginePairConfig cfg_;
  std::unique_ptr<BootstrapServer> server_;
  std::vector<HeadTransfer> plan_;
  std::vector<std::unique_ptr<EngineRank>> prefill_;
  std::vector<std::unique_ptr<EngineRank>> decode_;
};

// An EnginePair, or null with the reason recorded as a test failure (a test then ASSERTs non-null).
inline std::unique_ptr<EnginePair> make_engine_pair(const EnginePairConfig& cfg = {}) {
  auto p = EnginePair::create(cfg);
  EXPECT_TRUE(p.ok()) << p.status().str();
  return p.ok() ? std::move(p).value() : nullptr;
}

}  // namespace kvferry::testing
