// The replay router's engine instances (xPyD, router.h): the leader endpoint of every DP group
// of every prefill and decode instance, and the choice of instances per request: the instance of
// each role with the fewest outstanding requests (dispatched, not finished), ties to the lowest
// index. With one instance per role everything is instance 0, as before instances existed.
// Thread contract: plain data, the router's thread only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::replay {

// The index of the smallest count (ties: the lowest index); 0 for an empty list.
uint32_t least_outstanding(const std::vector<uint64_t>& outstanding);

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

  // The instance of `role` the next request goes to (least_outstanding()).
  uint32_t pick(Role role) const { return least_outstanding(outstanding_[idx(role)]); }
  void dispatched(Role role, uint32_t instance) { ++outstanding_[idx(role)][instance]; }
  void finished(Role role, uint32_t instance) {
    auto& n = outstanding_[idx(role)][instance];
    if (n > 0) --n;
  }
  uint64_t outstanding(Role role, uint32_t instance) const { return outstanding_[idx(role)][instance]; }

 private:
  static size_t idx(Role role) { return role == Role::kPrefill ? 0 : 1; }
  std::vector<std::vector<std::string>> leaders_[2];  // [role][instance][dp]
  std::vector<uint64_t> outstanding_[2];              // [role][instance]
  uint32_t dp_[2] = {1, 1};
};

}  // namespace kvferry::replay
