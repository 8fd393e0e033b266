// The replay's planned scaling (--scale, docs/report.md "Scaling while serving"): instances that
// join and leave while the trace is served. Spec: comma-separated events "t=<seconds>s:<+|-><role>"
// (e.g. "t=20s:+prefill,t=40s:-decode"); t counts from the router's first dispatch (the trace's
// time 0, wall clock after --time-scale). "+role" starts one more instance of the role (the next
// index after every instance started so far); "-role" drains and removes the live instance of the
// role with the highest index. Refused: an unknown role or form, a negative or non-finite time,
// more than kMaxScaleEvents events, removing a role's last live instance, more than 16 instances
// of a role started in all.
// Thread contract: pure functions and value types.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kvferry/error.h"

namespace kvferry::replay {

constexpr size_t kMaxScaleEvents = 32;
constexpr uint32_t kMaxInstancesPerRole = 16;

struct ScaleEvent {
  double t_s = 0;        // seconds after the router's first dispatch
  bool join = false;     // true: "+role" (a new instance); false: "-role" (drain and remove)
  Role role = Role::kPrefill;
  uint32_t instance = 0; // the instance that joins or leaves
  std::string str() const;  // "t=2s:+prefill"
};

// Events by time (ties: spec order), their instances resolved against `prefill_instances` /
// `decode_instances` started at the beginning. kInvalidArgument with a message for the user.
Result<std::vector<ScaleEvent>> parse_scale(const std::string& spec, uint32_t prefill_instances,
                                            uint32_t decode_instances);

// The instances of `role` started in all: the initial ones plus every join.
uint32_t total_instances(const std::vector<ScaleEvent>& events, Role role, uint32_t initial);

}  // namespace kvferry::replay
