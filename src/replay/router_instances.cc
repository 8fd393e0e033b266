// The router's engine instances (router_instances.h).
#include "replay/router_instances.h"

#include <algorithm>
#include <cstdint>

#include "kvferry/routing.h"

namespace kvferry::replay {

uint32_t least_outstanding(const std::vector<uint64_t>& outstanding, const std::vector<uint64_t>* tie) {
  auto key = [&](uint32_t i) {
    return std::pair{outstanding[i], tie && i < tie->size() ? (*tie)[i] : uint64_t{0}};
  };
  uint32_t best = 0;
  for (uint32_t i = 1; i < outstanding.size(); ++i)
    if (key(i) < key(best)) best = i;
  return best;
}

EngineInstances::EngineInstances(uint32_t prefill_instances, uint32_t prefill_dp, uint32_t decode_instances,
                                 uint32_t decode_dp, const std::vector<std::string>& prefill_leaders,
                                 const std::vector<std::string>& decode_leaders) {
  const uint32_t n[2] = {std::max<uint32_t>(1, prefill_instances), std::max<uint32_t>(1, decode_instances)};
  dp_[0] = std::max<uint32_t>(1, prefill_dp);
  dp_[1] = std::max<uint32_t>(1, decode_dp);
  const std::vector<std::string>* known[2] = {&prefill_leaders, &decode_leaders};
  for (size_t r = 0; r < 2; ++r) {
    leaders_[r].assign(n[r], std::vector<std::string>(dp_[r]));
    outstanding_[r].assign(n[r], 0);
    live_[r].assign(n[r], true);
    if (r == 0) pair_rooms_.assign(n[0], std::vector<uint64_t>(n[1], 0));
    if (r == 0) prefill_last_.assign(n[0], 0);
    for (size_t k = 0; k < known[r]->size() && k < size_t(n[r]) * dp_[r]; ++k) {
      leaders_[r][k / dp_[r]][k % dp_[r]] = (*known[r])[k];
    }
  }
}

std::pair<uint32_t, uint32_t> EngineInstances::pick() const {
  // A not-live instance counts as infinitely loaded.
  auto masked = [this](size_t r) {
    std::vector<uint64_t> v = outstanding_[r];
    for (size_t i = 0; i < v.size(); ++i)
      if (!live_[r][i]) v[i] = UINT64_MAX;
    return v;
  };
  const uint32_t p = least_outstanding(masked(0), &prefill_last_);
  return {p, least_outstanding(masked(1), &pair_rooms_[p])};
}

size_t EngineInstances::groups() const {
  return size_t(leaders_[0].size()) * dp_[0] + size_t(leaders_[1].size()) * dp_[1];
}

const std::string& EngineInstances::leader_for(Role role, uint32_t instance, uint64_t room) {
  auto& l = leaders(role, instance);
  return l[dp_rank_for_room(room, uint32_t(l.size()))];
}

}  // namespace kvferry::replay
