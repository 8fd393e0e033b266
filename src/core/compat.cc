// The compatibility fingerprint's comparison (kvferry/compat.h).
#include "kvferry/compat.h"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <set>

namespace kvferry {
namespace {

// "major.minor.patch" as three numbers; nullopt if it is not that.
std::optional<std::array<unsigned, 3>> parse_version(const std::string& s) {
  std::array<unsigned, 3> v{};
  const char* p = s.data();
  const char* end = s.data() + s.size();
  for (size_t i = 0; i < 3; ++i) {
    auto [next, ec] = std::from_chars(p, end, v[i]);
    if (ec != std::errc() || next == p) return std::nullopt;
    p = next;
    if (i < 2) {
      if (p == end || *p != '.') return std::nullopt;
      ++p;
    }
  }
  if (p != end) return std::nullopt;
  return v;
}

// a >= b, both versions; false if either is not one.
bool at_least(const std::string& a, const std::string& b) {
  auto va = parse_version(a);
  auto vb = parse_version(b);
  return va && vb && *va >= *vb;
}

// Does `support` ("host", "host+cuda") cover every kind of `kinds` ("host", "cuda", "host+cuda")?
bool supports(const std::string& support, const std::string& kinds) {
  auto split = [](const std::string& s) {
    std::set<std::string> out;
    size_t start = 0;
    while (start <= s.size()) {
      size_t plus = s.find('+', start);
      if (plus == std::string::npos) plus = s.size();
      out.insert(s.substr(start, plus - start));
      start = plus + 1;
    }
    return out;
  };
  const std::set<std::string> have = split(support);
  for (const std::string& k : split(kinds))
    if (!have.count(k)) return false;
  return true;
}

}  // namespace

std::string CompatMismatch::str() const { return fmt::format("{}: ours {}, theirs {}", field, ours, theirs); }

const std::string* compat_value(const Compat& c, const std::string& name) {
  for (const CompatField& f : c)
    if (f.name == name) return &f.value;
  return nullptr;
}

std::string compat_bounds_error(const Compat& c) {
  if (c.size() > kMaxCompatFields) return fmt::format("{} fields, more than {}", c.size(), kMaxCompatFields);
  std::set<std::string> seen;
  for (const CompatField& f : c) {
    if (f.name.empty() || f.name.size() > kMaxCompatNameBytes)
      return fmt::format("a field name of {} bytes (1..{})", f.name.size(), kMaxCompatNameBytes);
    if (f.value.size() > kMaxCompatValueBytes)
      return fmt::format("field {}: a value of {} bytes, more than {}", f.name, f.value.size(), kMaxCompatValueBytes);
    if (!seen.insert(f.name).second) return fmt::format("field {} twice", f.name);
    // Printable ASCII only: names and values go into log lines and errors as they are.
    for (const std::string* t : {&f.name, &f.value})
      for (char ch : *t)
        if (ch < 0x20 || ch > 0x7e) return fmt::format("field {}: a byte outside printable ASCII", seen.size());
  }
  return {};
}

std::optional<CompatMismatch> compat_mismatch(const Compat& ours, const Compat& theirs) {
  auto value = [](const std::string* v) { return v ? *v : std::string("absent"); };
  for (const CompatField& f : ours) {
    const std::string* t = compat_value(theirs, f.name);
    if (f.name == "version") {
      // Ours must be at least their minimum, theirs at least ours.
      const std::string* their_min = compat_value(theirs, "min_peer_version");
      const std::string* our_min = compat_value(ours, "min_peer_version");
      if (!t || !at_least(*t, our_min ? *our_min : f.value))
        return CompatMismatch{f.name, fmt::format("{} (accepting {} and later)", f.value, our_min ? *our_min : f.value),
                              value(t)};
      if (!their_min || !at_least(f.value, *their_min))
        return CompatMismatch{"min_peer_version", fmt::format("version {}", f.value), value(their_min)};
      continue;
    }
    if (f.name == "min_peer_version" || f.name == "memory_support") continue;
    if (f.name == "kv_memory") {
      // Each side must be able to move the other's KV memory.
      const std::string* their_support = compat_value(theirs, "memory_support");
      const std::string* our_support = compat_value(ours, "memory_support");
      if (!t || (our_support && !supports(*our_support, *t)))
        return CompatMismatch{f.name, fmt::format("{} (this build moves {})", f.value, value(our_support)), value(t)};
      if (!their_support || !supports(*their_support, f.value))
        return CompatMismatch{f.name, f.value, fmt::format("{} (that build moves {})", value(t), value(their_support))};
      continue;
    }
    if (!t || *t != f.value) return CompatMismatch{f.name, f.value, value(t)};
  }
  return std::nullopt;
}

}  // namespace kvferry
