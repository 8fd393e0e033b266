#include "replay/progress.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvferry::replay {

bool request_finished(const RequestOutcome& q) {
  return (q.prefill && q.decode) || !q.router_failure.empty();
}

Progress progress_of(const ReplayResults& r, int64_t now_ns) {
  Progress p;
  p.total = r.requests.size();
  for (const RequestOutcome& q : r.requests) {
    p.dispatched += q.dispatched_ns != 0;
    if (!request_finished(q)) continue;
    ++p.finished;
    if (q.prefill) p.bytes += q.prefill->bytes_transferred;
    const bool rejected = q.decode && q.decode->rejected;
    const bool ok = !rejected && q.router_failure.empty() && q.prefill->state == KVPoll::Success &&
                    q.decode->state == KVPoll::Success;
    ++(rejected ? p.rejected : ok ? p.succeeded : p.failed);
  }
  if (r.dispatch_start_ns > 0 && now_ns > r.dispatch_start_ns) p.seconds = double(now_ns - r.dispatch_start_ns) / 1e9;
  return p;
}

std::string progress_line(const Progress& p) {
  return fmt::format("replay: {}/{} requests done (ok {}, failed {}, rejected {}), {:.2f} GB moved, {:.3f} GB/s, {:.0f} s",
                     p.finished, p.total, p.succeeded, p.failed, p.rejected, double(p.bytes) / 1e9, p.gb_per_s(),
                     p.seconds);
}

std::string progress_bar(const Progress& p, size_t width) {
  const std::string tail = fmt::format(" {}/{} ok {} failed {} rejected {} | {:.2f} GB | {:.3f} GB/s", p.finished,
                                       p.total, p.succeeded, p.failed, p.rejected, double(p.bytes) / 1e9, p.gb_per_s());
  const size_t bar = width > tail.size() + 12 ? std::min<size_t>(40, width - tail.size() - 2) : 10;
  const size_t full = p.total ? bar * p.finished / p.total : 0;
  std::string s = fmt::format("[{}{}]{}", std::string(full, '#'), std::string(bar - full, '.'), tail);
  if (s.size() > width) s.resize(width);
  return s;
}

ReplayResults finished_only(const ReplayResults& r) {
  ReplayResults out = r;
  out.requests.clear();
  for (const RequestOutcome& q : r.requests)
    if (request_finished(q)) out.requests.push_back(q);
  return out;
}

}  // namespace kvferry::replay
