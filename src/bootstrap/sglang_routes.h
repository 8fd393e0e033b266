// The SGLang-shaped half of the bootstrap service (docs/sglang.md "Bootstrap"): the routes SGLang's
// prefill ranks, decode ranks and router use, served next to kvferry's own on one port.
//
//   PUT  /route   body {attn_tp_size, attn_tp_rank, attn_cp_size, attn_cp_rank, attn_dp_size,
//                 attn_dp_rank, pp_size, pp_rank, system_dp_size, system_dp_rank, rank_ip, rank_port,
//                 page_size, kv_cache_dtype, [load_balance_method], [enable_dsa_cache_layer_split],
//                 [prefill_http_port]}                                   -> 200 "OK"
//   GET  /route?prefill_dp_rank=D&prefill_cp_rank=C&target_tp_rank=T&target_pp_rank=P
//                 all four -1: the instance's parallel info              -> 200 {attn_tp_size, ...}
//                 otherwise: one rank                                    -> 200 {rank_ip, rank_port}
//                 not every rank registered yet                          -> 503
//                 that rank is not registered                            -> 404
//   POST /register_dp_rank  body {bootstrap_room, dp_rank}               -> 200 "OK"
//   POST /query_dp_ranks    body {bootstrap_rooms: [...]}                -> 200 {"<room>": dp_rank, ...}
// (The shapes are SGLang's, read from python/sglang/srt/disaggregation/common/conn.py.)
//
// Peers are untrusted: every field is type- and range-checked (sizes 1..kMaxSglangGroup, ranks
// below their size, a port 1..65535, strings bounded), a rank whose parallel sizes disagree with
// the first registration is refused (400), the rank table is bounded by the product of the sizes
// (at most kMaxSglangRanks), and the room -> DP rank map holds at most kMaxSglangRooms entries,
// each for kSglangRoomTtlNs (the oldest go first). Errors answer 400 with {"error": ...} naming
// the field. Thread contract: SglangRegistry is guarded by its own mutex.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json_fwd.hpp>

namespace kvferry::bootstrap {

constexpr uint32_t kMaxSglangGroup = 1024;       // bound on each of tp, cp, dp, pp sizes
constexpr size_t kMaxSglangRanks = 16384;        // bound on dp x cp x tp x pp
constexpr size_t kMaxSglangRooms = 1u << 20;     // room -> dp_rank entries kept
constexpr int64_t kSglangRoomTtlNs = 600'000'000'000;  // 10 minutes
constexpr size_t kMaxSglangQueryRooms = 32768;   // rooms per /query_dp_ranks (fits the 1 MiB body bound)

// One HTTP answer: status, body, content type.
struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "text/plain";
};

class SglangRegistry {
 public:
  Reply put_route(const nlohmann::json& body);
  // Query values as given (absent: nullptr).
  Reply get_route(const std::string* dp, const std::string* cp, const std::string* tp, const std::string* pp);
  Reply register_dp_rank(const nlohmann::json& body, int64_t now_ns);
  Reply query_dp_ranks(const nlohmann::json& body, int64_t now_ns);
  size_t registered() const;

 private:
  struct Parallel {
    uint32_t attn_tp_size = 0, attn_cp_size = 0, dp_size = 0, pp_size = 0;
    uint32_t page_size = 0;
    std::string kv_cache_dtype;
    bool follow_bootstrap_room = true;
    bool enable_dsa_cache_layer_split = false;
    int64_t prefill_http_port = -1;  // -1: not given
  };
  struct RankAddr {
    std::string ip;
    uint32_t port = 0;
  };
  using Key = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>;  // dp group, cp, tp, pp
  void expire(int64_t now_ns);  // under mu_

  mutable std::mutex mu_;
  bool have_parallel_ = false;
  Parallel parallel_;
  std::map<Key, RankAddr> ranks_;
  std::unordered_map<uint64_t, std::pair<uint32_t, int64_t>> rooms_;  // room -> (dp_rank, registered ns)
  std::deque<std::pair<uint64_t, int64_t>> room_order_;               // (room, registered ns), oldest first
};

}  // namespace kvferry::bootstrap
