// The replay router's engine instances (xPyD, router.h): the leader endpoint of every DP group
// of every prefill and decode instance, and the choice of instances per request: the instance of
// each role with the fewest outstanding requests (dispatched, not finished); for the prefill
// instance, among the least outstanding, the one chosen least recently comes first (so that an
// instance that joined (--scale) gets rooms on a lightly loaded replay, where the outstanding
// counts are mostly equal), then the lowest index, among the live ones (--scale: not yet joined or leaving ones are not chosen); for the
// decode instance, among the least outstanding, the one that served the chosen
// prefill instance the fewest rooms so far comes first (so that every decode instance serves
// rooms of every prefill instance: with the lowest index alone, equal loads would pair prefill i
// with decode i for good), then the lowest index. With one instance per role everything is
// instance 0, as before instances existed.
// Thread contract: plain data, the router's thread only.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::replay {

// The index of the smallest count (ties: the smallest `tie` entry when given, then the lowest
// index); 0 for an empty list.
uint32_t least_outstanding(const std::vector<uint64_t>& outstanding, const std::vector<uint64_t>* tie = nullptr);

class EngineInstances {
 public:
  // `*_leaders`: known leader endpoints, instance-major (index instance * dp + dp_rank); missing
  // ones are learned from the leaders' "ready" frames.
  EngineInstances(uint32_t prefill_instances, uint32_t prefill_dp, uint32_t decode_instances,
                  uint32_t decode_dp, const std::vector<std::string>& prefill_leaders,
                  const std::vector<std::string>& decode_leaders);

  uint32_t instances(Role role) const { return uint32_t(leaders_[idx(role)].size()); }
  uint32_t dp(Role role) const { return dp_[idx(role)]; }
  size_t groups() const;  // leaders of every instance of both roles
  // The leaders of `instance` of `role`, by DP rank.
  std::vector<std::string>& leaders(Role role, uint32_t instance) { return leaders_[idx(role)][instance]; }
  // The leader of the DP group of `instance` that serves `room` (kvferry/routing.h).
  const std::string& leader_for(Role role, uint32_t instance, uint64_t room);

  // The live instances the next request goes to (least_outstanding()): {prefill, decode}.
  std::pair<uint32_t, uint32_t> pick() const;
  // Whether the router may choose an instance (--scale, scale_plan.h): every instance is live
  // from the start, except one that joins later (live from its ready) and one that is leaving
  // (not live from its event on). pick() needs one live instance of each role.
  bool live(Role role, uint32_t instance) const { return live_[idx(role)][instance]; }
  void set_live(Role role, uint32_t instance, bool live) { live_[idx(role)][instance] = live; }
  void dispatched(uint32_t prefill, uint32_t decode) {
    ++outstanding_[0][prefill];
    ++outstanding_[1][decode];
    ++pair_rooms_[prefill][decode];
    prefill_last_[prefill] = ++dispatches_;
  }
  void finished(Role role, uint32_t instance) {
    auto& all = outstanding_[idx(role)];
    if (instance < all.size() && all[instance] > 0) --all[instance];
  }
  uint64_t outstanding(Role role, uint32_t instance) const { return outstanding_[idx(role)][instance]; }

 private:
  static size_t idx(Role role) { return role == Role::kPrefill ? 0 : 1; }
  std::vector<std::vector<std::string>> leaders_[2];  // [role][instance][dp]
  std::vector<uint64_t> outstanding_[2];              // [role][instance]
  std::vector<bool> live_[2];                         // [role][instance]
  std::vector<std::vector<uint64_t>> pair_rooms_;     // [prefill][decode]: requests dispatched
  std::vector<uint64_t> prefill_last_;                // [prefill]: its last request's number (0: none)
  uint64_t dispatches_ = 0;
  uint32_t dp_[2] = {1, 1};
};

}  // namespace kvferry::replay
