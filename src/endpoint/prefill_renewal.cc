// PrefillEndpoint's lease renewal (prefill_endpoint.h on_renewal; docs/manager.md "Renewal").
//
// A room's bootstrap deadline is its lease: decode's metadata must come within bootstrap_timeout
// of the room's opening. A decode rank that has init()ed the room but has no pages for it yet
// names it in a Heartbeat every renew_interval; each renewal moves the deadline to
// bootstrap_timeout from now, never past renew_limit after the opening (so a peer that renews
// and never sends metadata pins the pages for renew_limit at most), never earlier than it was.
// Only for a room held here in Bootstrapping, only from a destination of the room (the codec
// bounds the list; admits() and accept_incarnation() vetted the sender before). When decode dies
// or stops renewing, the deadline passes as before (prefill_endpoint.cc tick: bootstrap_timeout,
// origin this rank).
#include <algorithm>

#include <fmt/format.h>

#include "endpoint/prefill_endpoint.h"
#include "kvferry/log.h"

namespace kvferry {
namespace {
constexpr std::string_view kComp = "prefill.endpoint";
}  // namespace

void PrefillEndpoint::on_renewal(const Heartbeat& hb, int64_t now_ns) {
  const Deadlines& dl = core_.config().deadlines;
  const int64_t lease_ns = dl.bootstrap_timeout_ms * 1'000'000;
  const int64_t limit_ns = std::max(dl.renew_limit_ms, dl.bootstrap_timeout_ms) * 1'000'000;
  for (uint64_t id : hb.renew_rooms) {
    auto it = rooms_.find(id);
    if (it == rooms_.end()) continue;  // released, or not opened here: nothing to renew
    if (!from_destination("renewal", id, hb.sender)) continue;
    SenderRoom& r = it->second;
    if (r.state.get() != KVPoll::Bootstrapping) continue;  // metadata came, or the room ended
    if (r.planned && !r.engine && !bind(r, hb.sender.engine_id)) continue;  // its instance's from now on
    const int64_t to = std::min(now_ns + lease_ns, r.created_ns + limit_ns);
    if (to <= r.bootstrap_deadline_ns) continue;
    r.bootstrap_deadline_ns = to;
    if (r.renewals++ == 0) {
      LogFields f;
      f.room = id;
      f.extra.push_back({"peer", hb.sender.str()});
      log_event(LogLevel::kDebug, kComp, fmt::format("bootstrap deadline renewed by {}", hb.sender.str()), f);
    }
  }
}

}  // namespace kvferry
