// The registry of named transports (kvferry/transport.h): the one place a transport name is
// parsed. Built in: "shm" and "tcp", both the UCX transport. Also the small value helpers of
// transport.h (TransportCaps::supports, remote_info_for).
#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "kvferry/transport.h"

namespace kvferry {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, TransportFactory, std::less<>> factories;
};

TransportFactoryFn ucx_factory(TransportKind kind) {
  return [kind](const TransportOptions& options) {
    TransportOptions o = options;
    o.kind = kind;
    return make_ucx_transport(o);
  };
}

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: usable from static destructors
    reg->factories.emplace("shm", TransportFactory{"shm",
                                                   "UCX over shared memory (posix/sysv): one-sided "
                                                   "put into the peer's mapping, same host only",
                                                   ucx_factory(TransportKind::kShm)});
    reg->factories.emplace("tcp", TransportFactory{"tcp",
                                                   "UCX over TCP: active messages, the receiver "
                                                   "checks and copies every write",
                                                   ucx_factory(TransportKind::kTcp)});
    return reg;
  }();
  return *r;
}

std::string known_list(const Registry& r) {
  std::string out;
  for (const auto& [name, f] : r.factories) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

Status unknown(const Registry& r, std::string_view name) {
  std::string msg = "unknown transport '";
  msg += name;
  msg += "' (known: ";
  msg += known_list(r);
  msg += ')';
  return {ErrorCode::kInvalidArgument, msg};
}

}  // namespace

bool TransportCaps::supports(MemoryKind k) const {
  return std::find(memory_kinds.begin(), memory_kinds.end(), k) != memory_kinds.end();
}

RemoteRegionInfo remote_info_for(std::string worker_address, const std::vector<LocalRegion>& spans) {
  RemoteRegionInfo info;
  info.worker_address = std::move(worker_address);
  info.spans.reserve(spans.size());
  for (const LocalRegion& r : spans) {
    info.spans.push_back({r.offset, r.bytes, reinterpret_cast<uint64_t>(r.base), r.packed_rkey});
  }
  return info;
}

Status register_transport(TransportFactory factory) {
  if (factory.name.empty() || !factory.make) {
    return {ErrorCode::kInvalidArgument, "register_transport: a name and a factory are needed"};
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string name = factory.name;
  if (!r.factories.emplace(name, std::move(factory)).second) {
    return {ErrorCode::kInvalidArgument, "register_transport: '" + name + "' is registered already"};
  }
  return Status::Ok();
}

std::vector<std::string> transport_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [name, f] : r.factories) out.push_back(name);
  return out;  // std::map: sorted
}

Status check_transport_name(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.factories.find(name) != r.factories.end() ? Status::Ok() : unknown(r, name);
}

std::string describe_transports() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string out;
  for (const auto& [name, f] : r.factories) {
    if (!out.empty()) out += '\n';
    out += name + ": " + f.description;
  }
  return out;
}

Result<std::unique_ptr<Transport>> make_transport(std::string_view name,
                                                  const TransportOptions& options) {
  TransportFactoryFn make;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) return unknown(r, name);
    make = it->second.make;
  }
  return make(options);  // outside the lock: a factory may take long (UCX start-up)
}

}  // namespace kvferry
