// DecodeEndpoint's side of a refused pool registration (decode_endpoint.h): a prefill source that
// will not use our registration says why once (RegistrationRefusal); every room it feeds fails
// with that record, and rooms added later for it fail at once, with one line above debug for all
// of them (the rooms' own lines are debug: the record came in a message). A refusal for a lack of
// room at the source (resource_exhausted) is asked again every 5 s (retry_refused), its repeats at
// debug: a table of decode instances that was full for a while cuts no instance off for good.
#include <fmt/format.h>

#include <algorithm>

#include "endpoint/decode_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "decode.endpoint";
constexpr int64_t kRefusalRetryNs = 5'000'000'000;  // a source refused us for room: ask again after
constexpr int64_t kRegistrationResendNs = 1'000'000'000;  // a source silent since we registered
}  // namespace

void DecodeEndpoint::resend_unanswered(int64_t now_ns) {
  for (auto& [rank, p] : peers_) {
    if (p.heard || dead_peers_.count(rank) || left_.count(rank) || refused_.count(rank)) continue;
    if (monitor().last_heard_ns(rank) > p.watched_ns) {
      p.heard = true;
      continue;
    }
    if (now_ns - p.registered_ns < kRegistrationResendNs) continue;
    p.registered_ns = now_ns;
    // The same registration (same incarnation and pool): a source that has it already takes it as
    // a repeat. Not watched again: the silence since the first one still counts.
    Status s = core_.send(p.control_endpoint, make_registration(p.incarnation));
    log_event(LogLevel::kDebug, kComp,
              fmt::format("{} not heard from since the pool registration: sent it again ({})", rank.str(),
                          s.ok() ? "queued" : s.str()));
  }
}

bool DecodeEndpoint::in_plan(const RankId& r) const {
  // No bound on the DP rank: a room may name its prefill DP rank explicitly (add_room), beyond
  // the configured prefill DP size; the rooms' sources check it (on_status).
  if (r.role != Role::kPrefill || r.engine_id != 0) return false;
  for (uint32_t p : sources_of(plan_, core_.self().tp_rank))
    if (p == r.tp_rank) return true;
  return false;
}

bool DecodeEndpoint::admits(const RankId& sender) {
  if (in_plan(sender)) return true;
  core_.refuse(Refusal::kOutsidePlan, sender,
               fmt::format("frame from {} refused: not a source of {} in the transfer plan", sender.str(),
                           core_.self().str()));
  return false;
}

void DecodeEndpoint::on_refusal(const RegistrationRefusal& rf) {
  // Only a source we registered with may refuse us, with a record that names itself.
  if (!peers_.count(rf.sender) || rf.failure.origin != rf.sender || rf.failure.code == ErrorCode::kOk) {
    core_.peer_debug(kComp, fmt::format("registration refusal from {} ignored", rf.sender.str()));
    return;
  }
  if (refused_.count(rf.sender)) return;  // once per registration
  if (serving_.count(rf.sender)) {
    // It wrote rooms into our pool with this registration: it did not refuse it. Without the
    // cluster secret anyone may send a refusal in its name (docs/security.md).
    core_.peer_debug(kComp, fmt::format("registration refusal from {} ignored: it has served rooms of this "
                                        "registration",
                                        rf.sender.str()));
    return;
  }
  refused_[rf.sender] = rf.failure;
  const bool transient = rf.failure.code == ErrorCode::kResourceExhausted;
  const bool again = transient && refused_before_.count(rf.sender);
  if (transient) {
    // Not for good: the source had no room for another decode instance. Its heartbeats stop (it
    // keeps nothing of ours), so it is not watched meanwhile; the registration goes again later.
    refusal_retry_ns_[rf.sender] = monotonic_ns() + kRefusalRetryNs;
    monitor().unwatch(rf.sender);
  }
  std::vector<uint64_t> fed;
  for (auto& [id, r] : rooms_) {
    if (r.state.terminal()) continue;
    if (std::find(r.sources.begin(), r.sources.end(), rf.sender) != r.sources.end()) fed.push_back(id);
  }
  for (uint64_t id : fed) fail(id, rf.failure, /*observed_here=*/false, &rf.sender);
  log_event(again && fed.empty() ? LogLevel::kDebug : LogLevel::kError, kComp,
            fmt::format("prefill peer {} refused our pool registration: {}; {} rooms failed, later rooms it feeds "
                        "fail at once{}",
                        rf.sender.str(), rf.failure.reason, fed.size(),
                        transient ? fmt::format(" until it is asked again in {} s", kRefusalRetryNs / 1'000'000'000)
                                  : ""),
            {.code = std::string(code_name(rf.failure.code)), .origin = rf.sender.str(),
             .extra = {{"peer", rf.sender.str()}, {"event", "registration_refused"}}});
}

void DecodeEndpoint::retry_refused(int64_t now_ns) {
  for (auto it = refusal_retry_ns_.begin(); it != refusal_retry_ns_.end();) {
    const RankId peer = it->first;
    auto known = peers_.find(peer);
    if (!refused_.count(peer) || known == peers_.end()) {
      it = refusal_retry_ns_.erase(it);
      continue;
    }
    if (now_ns < it->second) {
      ++it;
      continue;
    }
    it = refusal_retry_ns_.erase(it);
    refused_before_.insert(peer);
    const PrefillPeer p = known->second;
    log_event(LogLevel::kDebug, kComp, fmt::format("registering with {} again: it refused us for room", peer.str()));
    (void)send_registration(peer, p.control_endpoint, p.incarnation);  // a new registration: a new answer
  }
}

bool DecodeEndpoint::fail_if_refused(uint64_t room) {
  auto it = rooms_.find(room);
  if (it == rooms_.end() || refused_.empty()) return false;
  for (const RankId& src : it->second.sources) {
    auto rf = refused_.find(src);
    if (rf == refused_.end()) continue;
    const Failure f = rf->second;
    fail(room, f, /*observed_here=*/false, &src);
    return true;
  }
  return false;
}

}  // namespace kvferry
