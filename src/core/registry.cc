// FailureRegistry: room -> root cause by the root-cause rule, guarded by one mutex (see registry.h).
#include "kvferry/registry.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace kvferry {
namespace {
constexpr size_t kMaxSecondary = 4;
constexpr size_t kMaxSuperseded = 4;

// The same failure heard again (from another rank, or twice): same origin, code and stamp.
bool same(const Failure& a, const Failure& b) {
  return a.origin == b.origin && a.code == b.code && a.first_seen_ns == b.first_seen_ns;
}

void add_bounded(std::vector<Failure>& v, const Failure& f) {
  if (v.size() >= kMaxSuperseded) return;
  for (const Failure& x : v)
    if (same(x, f)) return;
  v.push_back(f);
}
}  // namespace

struct FailureRegistry::Impl {
  struct Room {
    std::optional<KVTransferError> first;
    std::vector<KVTransferError> secondary;
    std::optional<Failure> own;
  };
  RankId self;
  mutable std::mutex mu;
  std::unordered_map<uint64_t, Room> rooms;
  size_t records = 0;
  uint64_t dropped = 0;

  void keep_secondary(Room& r, const KVTransferError& e) {
    if (r.secondary.size() < kMaxSecondary) r.secondary.push_back(e);
  }
};

FailureRegistry::FailureRegistry(RankId self) : impl_(std::make_unique<Impl>()) { impl_->self = self; }
FailureRegistry::~FailureRegistry() = default;

bool FailureRegistry::open(uint64_t room) {
  std::lock_guard lock(impl_->mu);
  return impl_->rooms.try_emplace(room).second;
}

bool FailureRegistry::is_open(uint64_t room) const {
  std::lock_guard lock(impl_->mu);
  return impl_->rooms.contains(room);
}

bool FailureRegistry::record(uint64_t room, ErrorCode code, std::string reason, RankId origin,
                             int64_t first_seen_ns) {
  bool local = origin == impl_->self;
  return record(room, code, std::move(reason), origin, first_seen_ns, local);
}

bool FailureRegistry::record(uint64_t room, ErrorCode code, std::string reason, RankId origin,
                             int64_t first_seen_ns, bool observed_here) {
  return record(room, Failure{code, origin, std::move(reason), first_seen_ns, 0}, observed_here);
}

bool FailureRegistry::record(uint64_t room, const Failure& in, bool observed_here) {
  Failure f = in;
  if (observed_here && f.wall_ns == 0) f.wall_ns = wall_from_monotonic(f.first_seen_ns);
  std::lock_guard lock(impl_->mu);
  auto it = impl_->rooms.find(room);
  if (it == impl_->rooms.end()) {
    ++impl_->dropped;
    return false;
  }
  Impl::Room& r = it->second;
  KVTransferError e = KVTransferError::from(room, f, !observed_here);
  if (!r.first) {
    r.first = std::move(e);
    if (observed_here) r.own = f;
    ++impl_->records;
    return true;
  }
  const Failure primary = r.first->failure();
  if (same(primary, f)) return false;  // a duplicate: no storms, no loops
  if (observed_here) {  // the room had failed here already: a consequence, never a root cause
    impl_->keep_secondary(r, e);
    return false;
  }
  for (const Failure& x : r.first->superseded)
    if (same(x, f)) return false;  // a loser heard again
  if (!failure_precedes(f, primary)) {
    add_bounded(r.first->superseded, f);
    impl_->keep_secondary(r, e);
    return false;
  }
  // A winner: it replaces the primary, which is kept as superseded by it.
  e.superseded = std::move(r.first->superseded);
  std::erase_if(e.superseded, [&](const Failure& x) { return same(x, f); });
  add_bounded(e.superseded, primary);
  KVTransferError old = std::move(*r.first);
  old.superseded.clear();
  impl_->keep_secondary(r, old);
  r.first = std::move(e);
  return true;
}

std::optional<KVTransferError> FailureRegistry::get(uint64_t room) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->rooms.find(room);
  if (it == impl_->rooms.end()) return std::nullopt;
  return it->second.first;
}

std::optional<Failure> FailureRegistry::own(uint64_t room) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->rooms.find(room);
  if (it == impl_->rooms.end()) return std::nullopt;
  return it->second.own;
}

std::vector<KVTransferError> FailureRegistry::secondary(uint64_t room) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->rooms.find(room);
  if (it == impl_->rooms.end()) return {};
  return it->second.secondary;
}

bool FailureRegistry::release(uint64_t room) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->rooms.find(room);
  if (it == impl_->rooms.end()) return false;
  if (it->second.first) --impl_->records;
  impl_->rooms.erase(it);
  return true;
}

size_t FailureRegistry::open_rooms() const {
  std::lock_guard lock(impl_->mu);
  return impl_->rooms.size();
}

size_t FailureRegistry::records() const {
  std::lock_guard lock(impl_->mu);
  return impl_->records;
}

uint64_t FailureRegistry::dropped_records() const {
  std::lock_guard lock(impl_->mu);
  return impl_->dropped;
}

}  // namespace kvferry
