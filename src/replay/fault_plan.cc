// Fault plan parsing and seeded assignment (fault_plan.h).
#include "replay/fault_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <set>

#include <fmt/format.h>

namespace kvferry::replay {
namespace {

constexpr const char* kKinds[] = {"transfer", "decode_fail", "prefill_fail", "timeout", "abort",
                                  "peer_death", "restart", "link_down", "partition", "pause", "corrupt"};
constexpr int64_t kMaxNetFaultMs = 600'000;
// Independent seeded streams (room ids use the plain seed in plan_requests).
constexpr uint64_t kRoomFaultStream = 0x6661756c74730001ULL;
constexpr uint64_t kPeerDeathStream = 0x6661756c74730002ULL;
constexpr uint64_t kNetFaultStream = 0x6661756c74730003ULL;

bool kills(const std::string& kind) { return kind == "peer_death" || kind == "restart"; }

// When `count` requests are planned: after 30-60% of them are dispatched (at least 1, at most
// count - 1).
uint64_t dispatch_threshold(std::mt19937_64& rng, size_t count);

Status bad_item(const std::string& item, const std::string& why) {
  return {ErrorCode::kInvalidArgument, fmt::format("--faults item '{}': {}", item, why)};
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t");
  return s.substr(a, b - a + 1);
}

std::string rank_str(Role role, uint32_t tp) { return RankId{role, 0, tp, 0}.str(); }

// `place` as a rank of this cluster, in RankId::str() form; "" when it is not one (`*why` says
// why). `names_dp`: the kind may name a DP group (peer_death, restart, pause).
std::string existing_rank(const std::string& place, bool names_dp, uint32_t prefill_tp, uint32_t decode_tp,
                          uint32_t prefill_dp, uint32_t decode_dp, std::string* why) {
  auto r = RankId::parse(place);
  if (!r || r->engine_id != 0) {
    *why = "place '" + place + "' is not prefill, decode or a rank like prefill/tp1";
    return "";
  }
  if (r->dp_rank != 0 && !names_dp) {
    *why = "only peer_death names a DP group: a room's fault acts in the group that serves the room";
    return "";
  }
  const uint32_t dp = std::max(1u, r->role == Role::kPrefill ? prefill_dp : decode_dp);
  if (r->dp_rank >= dp) {
    *why = fmt::format("{} does not exist: the {} engine has DP {}", place, role_name(r->role), dp);
    return "";
  }
  const uint32_t tp = r->role == Role::kPrefill ? prefill_tp : decode_tp;
  if (r->tp_rank >= tp) {
    *why = fmt::format("{} does not exist: the {} engine has TP {}", place, role_name(r->role), tp);
    return "";
  }
  return r->str();
}

// A rank for `kind` at `place`, drawn from `rng` when the place is not a rank.
std::string resolve(const std::string& kind, const std::string& place, std::mt19937_64& rng,
                    uint32_t prefill_tp, uint32_t decode_tp) {
  if (kind == "abort") return rank_str(Role::kDecode, 0);
  if (place == "prefill" || (place.empty() && kind == "prefill_fail")) {
    return rank_str(Role::kPrefill, uint32_t(rng() % prefill_tp));
  }
  if (place == "decode" || (place.empty() && (kind == "decode_fail" || kind == "corrupt"))) {
    return rank_str(Role::kDecode, uint32_t(rng() % decode_tp));
  }
  if (place.empty()) {
    const uint64_t r = rng() % (uint64_t(prefill_tp) + decode_tp);
    return r < prefill_tp ? rank_str(Role::kPrefill, uint32_t(r))
                          : rank_str(Role::kDecode, uint32_t(r - prefill_tp));
  }
  return place;
}

double uniform(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

uint64_t dispatch_threshold(std::mt19937_64& rng, size_t count) {
  const double fraction = 0.3 + 0.3 * uniform(rng);
  const uint64_t n = count;
  return std::clamp<uint64_t>(uint64_t(std::llround(fraction * double(n))), 1, n > 1 ? n - 1 : 1);
}

}  // namespace

bool FaultPlan::has_peer_death() const {
  return std::any_of(items.begin(), items.end(), [](const FaultItem& i) { return kills(i.kind); });
}

bool FaultPlan::has_net_faults() const {
  return std::any_of(items.begin(), items.end(), [](const FaultItem& i) { return i.is_net(); });
}

bool FaultPlan::has_pauses() const {
  return std::any_of(items.begin(), items.end(), [](const FaultItem& i) { return i.kind == "pause"; });
}

double FaultPlan::total_rate() const {
  double s = 0;
  for (const auto& i : items) s += i.once || i.is_timed() ? 0 : i.rate;
  return s;
}

std::string FaultPlan::str() const {
  std::string out;
  for (const auto& i : items) {
    if (!out.empty()) out += ',';
    out += fmt::format("{}{}{}:{}", i.kind, i.place.empty() ? "" : "@", i.place,
                       i.is_timed() ? std::to_string(i.ms) : i.once ? std::string("once") : fmt::format("{}", i.rate));
  }
  return out;
}

Result<FaultPlan> parse_fault_plan(const std::string& spec, uint32_t prefill_tp,
                                   uint32_t decode_tp, uint32_t prefill_dp, uint32_t decode_dp) {
  FaultPlan plan;
  if (trim(spec).empty()) return plan;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = trim(spec.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) {
      return Status(ErrorCode::kInvalidArgument, "--faults '" + spec + "' has an empty item");
    }
    size_t colon = item.rfind(':');
    const bool bare_restart = item.rfind("restart@", 0) == 0 && colon == std::string::npos;
    if (colon == std::string::npos && !bare_restart)
      return bad_item(item, "expected KIND[@PLACE]:RATE, KIND[@PLACE]:once, restart@RANK or KIND@HOST:MS");
    if (bare_restart) colon = item.size();
    FaultItem f;
    std::string head = trim(item.substr(0, colon));
    const std::string amount = bare_restart ? std::string("once") : trim(item.substr(colon + 1));
    const size_t at = head.find('@');
    if (at != std::string::npos) {
      f.place = trim(head.substr(at + 1));
      head = trim(head.substr(0, at));
      if (f.place.empty()) return bad_item(item, "empty place after '@'");
    }
    f.kind = head;
    if (std::find(std::begin(kKinds), std::end(kKinds), f.kind) == std::end(kKinds)) {
      return bad_item(item, "unknown kind '" + f.kind +
                                "' (known: transfer, decode_fail, prefill_fail, timeout, abort, peer_death, "
                                "restart, link_down, partition, pause, corrupt)");
    }
    if (f.is_timed()) {
      if (f.place.empty())
        return bad_item(item, f.kind + (f.is_net() ? " needs a host: " : " needs a rank: ") + f.kind +
                                  (f.is_net() ? "@HOST:MS" : "@RANK:MS"));
      if (f.kind == "pause") {  // one rank that exists (DP group 0 unless named)
        if (f.place == "prefill" || f.place == "decode")
          return bad_item(item, "pause names one rank: pause@RANK:MS, e.g. pause@prefill/tp1:3000");
        std::string why;
        f.place = existing_rank(f.place, true, prefill_tp, decode_tp, prefill_dp, decode_dp, &why);
        if (f.place.empty()) return bad_item(item, why);
      }
      char* end = nullptr;
      const long long ms = std::strtoll(amount.c_str(), &end, 10);
      if (amount.empty() || end != amount.c_str() + amount.size() || ms < 1 || ms > kMaxNetFaultMs)
        return bad_item(item, fmt::format("'{}' is not a duration in ms (1..{})", amount, kMaxNetFaultMs));
      f.ms = ms;
      plan.items.push_back(std::move(f));
      continue;
    }
    if (f.kind == "restart" && (f.place.empty() || f.place == "prefill" || f.place == "decode"))
      return bad_item(item, "restart names one rank: restart@RANK, e.g. restart@decode/tp1");
    if (!f.place.empty() && f.place != "prefill" && f.place != "decode") {
      std::string why;
      f.place = existing_rank(f.place, kills(f.kind), prefill_tp, decode_tp, prefill_dp, decode_dp, &why);
      if (f.place.empty()) return bad_item(item, why);
    }
    const bool on_prefill = f.place.rfind("prefill", 0) == 0;
    if (f.kind == "decode_fail" && on_prefill) return bad_item(item, "decode_fail acts on decode ranks only");
    if (f.kind == "corrupt" && (on_prefill || f.place == "prefill"))
      return bad_item(item, "corrupt names the decode rank whose incoming bytes are flipped (it detects it)");
    if (f.kind == "prefill_fail" && !f.place.empty() && !on_prefill) {
      return bad_item(item, "prefill_fail acts on prefill ranks only");
    }
    if (f.kind == "abort" && !f.place.empty() && f.place != "decode" && f.place != "decode/tp0") {
      return bad_item(item, "abort is sent to the decode leader (decode/tp0); no other place");
    }
    if (f.kind == "abort") f.place = "";
    if (amount == "once") {
      f.once = true;
    } else {
      char* end = nullptr;
      f.rate = std::strtod(amount.c_str(), &end);
      if (amount.empty() || end != amount.c_str() + amount.size() || !std::isfinite(f.rate) ||
          f.rate < 0 || f.rate > 1) {
        return bad_item(item, "'" + amount + "' is neither a rate in [0, 1] nor 'once'");
      }
      if (kills(f.kind)) return bad_item(item, f.kind + " takes 'once', not a rate");
    }
    plan.items.push_back(std::move(f));
  }
  if (plan.total_rate() > 1 + 1e-9) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("--faults '{}': the rates add up to {} > 1 (each request gets at most "
                              "one fault)",
                              spec, plan.total_rate()));
  }
  return plan;
}

FaultPlan fault_rate_plan(double p) {
  FaultPlan plan;
  if (p > 0) {
    plan.items.push_back({"transfer", "prefill", p / 2, false});
    plan.items.push_back({"decode_fail", "decode", p / 2, false});
  }
  return plan;
}

std::string expected_code(const FaultSpec& f) {
  switch (f.kind) {
    case FaultKind::kTransfer: return "transfer_error";
    case FaultKind::kDecodeFail:
    case FaultKind::kPrefillFail: return "injected";
    case FaultKind::kTimeout: return f.at.role == Role::kDecode ? "waiting_timeout" : "bootstrap_timeout";
    case FaultKind::kAbort: return "aborted";
    case FaultKind::kCorrupt: return "integrity_error";
  }
  return "";
}

std::vector<std::optional<FaultSpec>> assign_room_faults(const FaultPlan& plan, size_t count,
                                                         uint64_t seed, uint32_t prefill_tp,
                                                         uint32_t decode_tp) {
  std::vector<std::optional<FaultSpec>> out(count);
  std::mt19937_64 rng(seed ^ kRoomFaultStream);
  prefill_tp = std::max(1u, prefill_tp);
  decode_tp = std::max(1u, decode_tp);
  // `once` items first, on distinct requests.
  std::set<size_t> taken;
  for (const auto& item : plan.items) {
    if (!item.once || kills(item.kind) || item.is_timed() || taken.size() >= count) continue;
    size_t i = rng() % count;
    while (taken.count(i)) i = (i + 1) % count;
    taken.insert(i);
    out[i] = fault_from_names(item.kind, resolve(item.kind, item.place, rng, prefill_tp, decode_tp));
  }
  if (plan.total_rate() <= 0) return out;
  for (size_t i = 0; i < count; ++i) {
    const double u = uniform(rng);
    if (taken.count(i)) continue;
    double cum = 0;
    for (const auto& item : plan.items) {
      if (item.once || item.is_timed()) continue;
      cum += item.rate;
      if (u < cum) {
        out[i] = fault_from_names(item.kind, resolve(item.kind, item.place, rng, prefill_tp, decode_tp));
        break;
      }
    }
  }
  return out;
}

std::vector<PlannedPeerDeath> plan_peer_deaths(const FaultPlan& plan, size_t count, uint64_t seed,
                                               uint32_t prefill_tp, uint32_t decode_tp) {
  std::vector<PlannedPeerDeath> out;
  std::mt19937_64 rng(seed ^ kPeerDeathStream);
  for (const auto& item : plan.items) {
    if (!kills(item.kind)) continue;
    PlannedPeerDeath d;
    d.rank = resolve(item.kind, item.place, rng, std::max(1u, prefill_tp), std::max(1u, decode_tp));
    d.after_dispatched = dispatch_threshold(rng, count);
    d.same_ports = item.kind == "restart";
    out.push_back(std::move(d));
  }
  std::stable_sort(out.begin(), out.end(), [](const PlannedPeerDeath& a, const PlannedPeerDeath& b) {
    return a.after_dispatched < b.after_dispatched;
  });
  return out;
}

std::vector<std::string> same_port_restarts(const FaultPlan& plan) {
  std::vector<std::string> out;
  for (const auto& item : plan.items)
    if (item.kind == "restart" && std::find(out.begin(), out.end(), item.place) == out.end()) out.push_back(item.place);
  return out;
}

std::vector<PlannedNetFault> plan_net_faults(const FaultPlan& plan, size_t count, uint64_t seed) {
  std::vector<PlannedNetFault> out;
  std::mt19937_64 rng(seed ^ kNetFaultStream);
  for (const auto& item : plan.items) {
    if (!item.is_timed()) continue;
    out.push_back({item.kind, item.place, item.ms, dispatch_threshold(rng, count)});
  }
  std::stable_sort(out.begin(), out.end(), [](const PlannedNetFault& a, const PlannedNetFault& b) {
    return a.after_dispatched < b.after_dispatched;
  });
  return out;
}

double abort_delay_ms(uint64_t seed, uint64_t room) {
  // splitmix64 of (seed, room): a stable per-room draw independent of the plan's streams.
  uint64_t z = seed * 0x9e3779b97f4a7c15ULL + room;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return 2.0 + 8.0 * (double(z >> 11) * 0x1.0p-53);
}

}  // namespace kvferry::replay
