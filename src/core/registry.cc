// FailureRegistry: room -> first failure cause, guarded by one mutex (see registry.h).
#include "kvferry/registry.h"

#include <mutex>
#include <unordered_map>

namespace kvferry {
namespace {
constexpr size_t kMaxSecondary = 4;
}  // namespace

struct FailureRegistry::Impl {
  struct Room {
    std::optional<KVTransferError> first;
    std::vector<KVTransferError> secondary;
  };
  RankId self;
  mutable std::mutex mu;
  std::unordered_map<uint64_t, Room> rooms;
  size_t records = 0;
  uint64_t dropped = 0;
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
  std::lock_guard lock(impl_->mu);
  auto it = impl_->rooms.find(room);
  if (it == impl_->rooms.end()) {
    ++impl_->dropped;
    return false;
  }
  KVTransferError e;
  e.bootstrap_room = room;
  e.code = code;
  e.failure_reason = std::move(reason);
  e.origin = origin;
  e.is_from_another_rank = !observed_here;
  e.first_seen_ns = first_seen_ns;
  Impl::Room& r = it->second;
  if (!r.first) {
    r.first = std::move(e);
    ++impl_->records;
    return true;
  }
  if (r.secondary.size() < kMaxSecondary) r.secondary.push_back(std::move(e));
  return false;
}

std::optional<KVTransferError> FailureRegistry::get(uint64_t room) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->rooms.find(room);
  if (it == impl_->rooms.end()) return std::nullopt;
  return it->second.first;
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
