// Writes the seed corpora of fuzz/corpus/<target>/ with the real encoders (docs/testing.md,
// "Fuzzing"): `fuzz_seeds <corpus dir>`. Small valid messages of every kind each decoder takes;
// the fuzzers mutate from there. Each is checked against its decoder: exit status 1 names any
// seed the decoder refuses. Re-run after a wire format change and commit the result.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bootstrap/rank_info_json.h"
#include "bootstrap/sglang_routes.h"
#include "core/request_mac.h"
#include "driver/engine_protocol.h"
#include "driver/sync_codec.h"
#include "kvferry/messages.h"
#include "kvferry/net.h"
#include "kvferry/trace.h"
#include "replay/peer_death_frames.h"
#include "transport/ucx/am_wire.h"
#include "transport/ucx/shard_address.h"

namespace fs = std::filesystem;
using namespace kvferry;

namespace {

fs::path root;
int refused = 0;

// Whether the target's decoder accepts the seed (a seed it refuses only exercises the first check).
bool accepted(const std::string& target, const std::string& b) {
  if (target == "control_codec" || target == "remote_info") return decode(b).ok();
  if (target == "shard_address") return ucx::parse_shard_address(b).ok();
  if (target == "engine_sync") return decode_sync_frame(b).ok();
  if (target == "router_protocol") {
    auto pd = replay::decode_peer_death_frame(b);
    return decode_router_frame(b).ok() || (pd.ok() && pd->has_value());
  }
  if (target == "rank_info_json") return bootstrap::rank_info_from_json(nlohmann::json::parse(b, nullptr, false)).ok();
  if (target == "trace") return parse_trace(b, 0).ok();
  if (target == "endpoint_address") return parse_host_port(b).ok();
  if (target == "request_mac") return security::parse_mac_header(b).ok();
  if (target == "am_wire") {  // the spans of fuzz/am_wire_fuzz.cc
    static std::vector<uint8_t> a(4096), c(8192);
    ucx::SpanTable spans({{0, 4096, a.data()}, {16384, 8192, c.data()}});
    const auto* p = reinterpret_cast<const uint8_t*>(b.data()) + 1;
    const size_t n = b.size() - 1;
    if (b[0] == 0) {
      uint64_t payload = 0;
      std::memcpy(&payload, p, 8);
      ucx::AmWriteHeader h;
      uint8_t* dst = nullptr;
      return parse_write_header(p + 8, n - 8, payload, spans, &h, &dst).ok();
    }
    if (b[0] == 1) {
      ucx::AmScatterHeader h;
      const size_t hs = sizeof(ucx::AmScatterHeader);
      return parse_scatter_header(p, hs, n - hs, &h).ok() && place_scatter(h, p + hs, n - hs, spans).ok();
    }
    if (b[0] == 3) {  // a room's ranges and one write: the fence opens them
      std::vector<FenceRange> ranges((n - 16) / 16);
      if (!ranges.empty()) std::memcpy(ranges.data(), p, ranges.size() * 16);
      WriteFence f;
      return f.open(7, ranges).ok();
    }
    ucx::AmAck ack;
    return parse_ack(p, n, &ack);
  }
  if (target == "sglang_routes") {  // every request of the session answered 200
    bootstrap::SglangRegistry reg;
    std::string line;
    std::istringstream lines(b);
    while (std::getline(lines, line)) {
      if (line.size() < 2 || line[0] == 'G') continue;  // lookups may answer 404 on purpose
      auto j = nlohmann::json::parse(line.substr(2), nullptr, false);
      auto r = line[0] == 'P' ? reg.put_route(j) : line[0] == 'R' ? reg.register_dp_rank(j, 1) : reg.query_dp_ranks(j, 1);
      if (r.status != 200) return false;
    }
    return true;
  }
  return false;
}

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  if (!accepted(target, bytes)) {
    std::fprintf(stderr, "seed %s/%s: its decoder refuses it\n", target.c_str(), name.c_str());
    ++refused;
  }
  fs::create_directories(root / target);
  std::ofstream(root / target / name, std::ios::binary) << bytes;
}

template <class T>
std::string pod(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}

RankId rank(Role role, uint32_t tp) { return RankId{role, 0, tp, 0}; }

void control() {
  PoolRegistration reg;
  reg.sender = rank(Role::kDecode, 1);
  reg.compat = {{"version", "0.1.0"}, {"min_peer_version", "0.1.0"}, {"wire", "5"}, {"page_size", "16"},
                {"kv_memory", "host"}, {"memory_support", "host"}, {"tp", "prefill 2 decode 1"}};
  reg.control_endpoint = "tcp://127.0.0.1:5601";
  reg.worker_address = ucx::encode_shard_address({"worker-a", "worker-b"});
  reg.spans = {{0, 1 << 20, 0x7f0000000000, "rkey-0"}, {1 << 20, 4096, 0x7f0000200000, "rkey-1"}};
  reg.page_size = 16;
  reg.page_bytes = 4096;
  reg.num_pages = 64;
  reg.kv_offsets = {0, 262144};
  reg.aux_offsets = {1 << 20};
  reg.aux_item_bytes = {64};
  reg.aux_rows = 8;
  reg.state_offsets = {(1 << 20) + 1024};
  reg.state_item_bytes = {32};
  reg.state_rows = 8;
  reg.guard_offset = (1 << 20) + 2048;
  reg.heads_per_rank = 4;
  reg.first_head = 4;
  reg.incarnation = 1764660000000000001;
  reg.peer_incarnation = 1764660000000000002;
  RoomMetadata meta{42, rank(Role::kDecode, 1), {3, 4, 5}, 2, {1}, 2, 11, 12};
  RoomStatus ok{42, rank(Role::kPrefill, 0), KVPoll::Success, {ErrorCode::kOk, {}, "", 0, 0}, true, 12, 11};
  RoomStatus failed{42, rank(Role::kDecode, 1), KVPoll::Failed,
                    {ErrorCode::kTransferError, rank(Role::kDecode, 1), "write failed", 5, 6}, false, 11, 12};
  Heartbeat hb{rank(Role::kPrefill, 0), 7, 123456789, 12};
  Heartbeat challenge = hb;  // a restart claim's challenge (docs/security.md, "Incarnations")
  challenge.challenge = 0x0123456789abcdefull;
  Heartbeat renewal{rank(Role::kDecode, 1), 0, 123456789, 11};  // a lease renewal (docs/manager.md "Renewal")
  renewal.renew_rooms = {42, 43};
  Heartbeat leaving_renewal = renewal;  // an orderly shutdown's last heartbeat (messages.h Heartbeat::leaving)
  leaving_renewal.leaving = true;
  Heartbeat leaving = hb;
  leaving.leaving = true;
  RegistrationRefusal refusal{rank(Role::kPrefill, 0),
                              {ErrorCode::kProtocolError, rank(Role::kPrefill, 0), "bad spans", 1, 2}, 12, 11};
  int n = 0;
  for (const Message& m : std::vector<Message>{reg, meta, ok, failed, hb, refusal, challenge, renewal, leaving_renewal, leaving}) {
    const std::string frame = encode(m);
    put("control_codec", "msg" + std::to_string(n), frame);
    if (n == 0) put("remote_info", "registration", frame);
    ++n;
  }
  reg.worker_address = "plain-ucp-worker-address";
  put("remote_info", "one_shard", encode(reg));
}

void am_wire() {
  ucx::AmWriteHeader w;
  w.batch_id = 9;
  w.room = 1;  // open in fuzz/am_wire_fuzz.cc, [16448, 20544) among its ranges
  w.offset = 16384 + 128;
  w.length = 256;
  uint64_t payload = 256;
  put("am_wire", "write", std::string(1, '\0') + pod(payload) + pod(w));
  ucx::AmScatterHeader s;
  s.count = 2;
  s.batch_id = 9;
  s.room = 1;
  s.data_bytes = 24;
  ucx::AmScatterEntry e1{64, 8}, e2{16448, 16};
  put("am_wire", "scatter", std::string(1, '\1') + pod(s) + pod(e1) + pod(e2) + std::string(24, 'x'));
  ucx::AmAck ack;
  ack.batch_id = 9;
  ack.room = 1;
  put("am_wire", "ack", std::string(1, '\2') + pod(ack));
  // The fence: three ranges (two touching), then a write over their seam.
  FenceRange r1{4096, 64}, r2{4160, 64}, r3{0, 16}, write{4150, 20};
  put("am_wire", "fence", std::string(1, '\3') + pod(r1) + pod(r2) + pod(r3) + pod(write));
}

void shard_address() {
  put("shard_address", "two", ucx::encode_shard_address({"worker-a", "worker-bb"}));
  put("shard_address", "eight", ucx::encode_shard_address({"a", "b", "c", "d", "e", "f", "g", "h"}));
  put("shard_address", "plain", "plain-ucp-worker-address");
}

void engine() {
  Decision nd;
  nd.op = Decision::Op::kNew;
  nd.room = 42;
  nd.request = {42, 100, 10, 5, fault_from_names("transfer", "prefill/tp1")};
  Decision fd;
  fd.op = Decision::Op::kFail;
  fd.room = 43;
  fd.code = ErrorCode::kTransferError;
  fd.origin = "decode/tp0";
  fd.reason = "write failed";
  fd.first_seen_ns = 10;
  fd.wall_ns = 20;
  Decision rd;
  rd.op = Decision::Op::kRelease;
  rd.room = 43;
  rd.quarantine = true;
  std::vector<EngineMember> members{{0, "tcp://127.0.0.1:6000"}, {1, "tcp://127.0.0.1:6001"}};
  put("engine_sync", "hello", encode_hello(1, "tcp://127.0.0.1:6001"));
  put("engine_sync", "step", encode_step(3, false, {nd, fd, rd}, &members));
  put("engine_sync", "step_shutdown", encode_step(4, true, {}));
  put("engine_sync", "fail", encode_fail({43, 1, ErrorCode::kTransferError, "prefill/tp1", "boom", 10, 20}));
  put("engine_sync", "hi", encode_hi(1));
  RoomReport rep;
  rep.room = 43;
  rep.tp_rank = 1;
  rep.poll = KVPoll::Failed;
  rep.has_failure = true;
  rep.code = ErrorCode::kTransferError;
  rep.origin = "prefill/tp1";
  rep.reason = "boom";
  RankLeakStats stats;
  stats.rank = "decode/tp1";
  stats.live_rooms = 1;
  put("engine_sync", "reply", encode_reply(3, 1, {rep}, stats));
  put("engine_sync", "abort", encode_abort(43));

  RoomResult res;
  res.role = Role::kDecode;
  res.room = 43;
  res.code = ErrorCode::kTransferError;
  res.origin = "prefill/tp1";
  res.reason = "boom";
  res.ranks_failed = 2;
  put("router_protocol", "request", encode_request(nd.request));
  put("router_protocol", "shutdown", encode_shutdown());
  put("router_protocol", "ready", encode_ready(Role::kDecode, 2, 1, "tcp://127.0.0.1:6000"));
  put("router_protocol", "result", encode_result(res));
  put("router_protocol", "stats", encode_stats(Role::kDecode, {stats}, 0));
  put("router_protocol", "abort", encode_abort(43));
  put("router_protocol", "rank_up", encode_rank_up(rank(Role::kDecode, 1)));
  put("router_protocol", "kill", replay::encode_peer_death("kill", "prefill/tp1", 0, ""));
  put("router_protocol", "killed", replay::encode_peer_death("killed", "prefill/tp1", 99, ""));
  put("router_protocol", "kill_failed", replay::encode_peer_death("kill_failed", "prefill/tp1", 0, "no pid"));
}

void rank_info() {
  PrefillRankInfo info;
  info.engine_id = 0;
  info.dp_rank = 0;
  info.tp_rank = 1;
  info.tp_size = 2;
  info.host = "127.0.0.1";
  info.control_endpoint = "tcp://127.0.0.1:5600";
  info.page_size = 16;
  info.dtype = "bfloat16";
  info.model = "Llama-3.1-8B";
  info.num_layers = 32;
  info.heads_per_rank = 4;
  info.first_head = 4;
  info.compat = {{"version", "0.1.0"}, {"page_size", "16"}, {"tp", "prefill 2 decode 1"}};
  info.incarnation = 17;
  put("rank_info_json", "rank", bootstrap::dump(bootstrap::rank_info_to_json(info)));
  info.host = "fd00::5";
  info.control_endpoint = "tcp://[fd00::5]:5600";
  put("rank_info_json", "rank_v6", bootstrap::dump(bootstrap::rank_info_to_json(info)));
}

// Lines of "<op> <body>" (fuzz/sglang_routes_fuzz.cc): two prefill ranks register, a room is
// routed to a DP rank, then lookups of every kind.
void sglang_routes() {
  auto body = [](int tp, int port) {
    nlohmann::json j = {{"attn_tp_size", 2}, {"attn_tp_rank", tp}, {"attn_cp_size", 1}, {"attn_cp_rank", 0},
                        {"attn_dp_size", 1}, {"attn_dp_rank", 0}, {"pp_size", 1}, {"pp_rank", 0},
                        {"system_dp_size", 1}, {"system_dp_rank", 0}, {"rank_ip", "10.0.0.5"},
                        {"rank_port", port}, {"page_size", 16}, {"kv_cache_dtype", "auto"},
                        {"load_balance_method", "follow_bootstrap_room"}, {"prefill_http_port", 30000}};
    return j.dump();
  };
  put("sglang_routes", "session",
      "P " + body(0, 7000) + "\nP " + body(1, 7001) + "\nG -1 -1 -1 -1\nG 0 0 1 0\n" +
          "R {\"bootstrap_room\":42,\"dp_rank\":0}\nQ {\"bootstrap_rooms\":[42,43]}\n");
  put("sglang_routes", "missing", "G 0 0 0 0\nG - 0 0 0\nQ {\"bootstrap_rooms\":[]}\n");
}

// Both trace formats (src/core/trace.cc), a few lines each.
void trace() {
  put("trace", "mooncake.jsonl",
      "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": [0, 1, 2]}\n"
      "{\"timestamp\": 27, \"input_length\": 7322, \"output_length\": 490, \"hash_ids\": [0, 14]}\n");
  put("trace", "azure.csv",
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:17:03.9799600,4808,10\n"
      "2023-11-16 18:17:04.0319600,3180,8\n");
}

// Control endpoints and bootstrap addresses as peers announce them (src/core/net.cc).
void endpoint_address() {
  put("endpoint_address", "v4", "tcp://127.0.0.1:5601");
  put("endpoint_address", "v6", zmq_endpoint("fd00::5", 5600));
  put("endpoint_address", "name", "http://prefill-0.cluster.local:8998");
  put("endpoint_address", "any_port", "10.0.0.5:*");
}

// Bootstrap Authorization headers (src/core/request_mac.cc): one a client sends, one with a
// ts at the edge of what parses.
void request_mac() {
  auto keys = security::derive_keys("request mac fuzz secret 0123456789");
  security::Nonce n{};
  n[0] = 1;
  put("request_mac", "lookup",
      security::mac_authorization(*keys, "GET", "/health", "", 1'800'000'000, n));
  put("request_mac", "big_ts", "KVF-MAC v=1,ts=9223372036854775807,nonce=" + std::string(32, 'a') +
                                   ",mac=" + std::string(64, 'f'));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  root = argv[1];
  control();
  am_wire();
  shard_address();
  engine();
  rank_info();
  sglang_routes();
  trace();
  endpoint_address();
  request_mac();
  return refused == 0 ? 0 : 1;
}
