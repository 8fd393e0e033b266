// The compatibility fingerprint (issue 34; docs/failure-model.md "Compatibility"): what a prefill
// rank and a decode rank must agree on before either uses anything else the other sent.
//
// A fingerprint is a short list of named text fields. Every prefill rank's bootstrap entry
// (PrefillRankInfo::compat) and every decode rank's pool registration (PoolRegistration::compat,
// the first field after the sender on the wire) carries its rank's fingerprint; the receiving
// rank compares it with its own before it reads or uses any other field of the entry or frame
// (a decode rank before it connects to the prefill rank's transport address; a prefill rank
// before its transport parses the decode rank's memory keys). A mismatch is refused with one
// error line on each side naming the first field that differs and both values, and the rooms
// between the two ranks fail with code incompatible_peer.
//
// Fields (in this order; compat_mismatch checks them in the order of `ours`):
//   version          kvferry's version of the build ("0.1.0")
//   min_peer_version the oldest peer build this one works with
//   wire             the control protocol version (kvferry/messages.h kProtocolVersion)
//   model, attention, layers, kv_heads, head_dim, dtype_bytes   the model's KV geometry
//   page_size        tokens per page
//   layout           KV buffers and aux/state row sizes ("kv_buffers=64 aux=[8] state=[]")
//   kv_memory        where this rank's KV buffers live: "host", "cuda" or "host+cuda"
//   memory_support   the memory kinds this build can move: "host" or "host+cuda"
//   tp               the TP sizes as both sides see them: "prefill 4 decode 2"
//   transport        the transport and what both ends of it must size alike ("shm seg 32832", "tcp")
// Rules: version and min_peer_version are checked as a range each way (ours >= their minimum and
// theirs >= our minimum); kv_memory is checked against the other side's memory_support (a peer's
// cuda KV needs a build that moves cuda); memory_support itself is not compared; every other
// field must be equal. A field of ours the peer lacks is a mismatch ("absent"); a field only the
// peer has (a newer build's) is ignored: its version range decides whether that matters.
// Thread contract: pure functions.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace kvferry {

struct CompatField {
  std::string name;
  std::string value;
  bool operator==(const CompatField&) const = default;
};
using Compat = std::vector<CompatField>;

// Bounds of a fingerprint on the wire and in JSON (a peer's is refused beyond them).
constexpr size_t kMaxCompatFields = 32;
constexpr size_t kMaxCompatNameBytes = 64;
constexpr size_t kMaxCompatValueBytes = 256;

// This build's version and the oldest peer version it works with ("major.minor.patch").
inline constexpr const char* kKvferryVersion = "0.1.0";
inline constexpr const char* kMinPeerVersion = "0.1.0";

struct CompatMismatch {
  std::string field;
  std::string ours;    // our value ("absent" when we do not have the field)
  std::string theirs;  // the peer's value ("absent" when it sent none)
  // "page_size: ours 16, theirs 32" (the form every line and record uses).
  std::string str() const;
};

// The first difference between our fingerprint and a peer's, or nullopt when they agree.
// An empty `ours` agrees with anything (a rank built without one: in-process endpoint tests).
std::optional<CompatMismatch> compat_mismatch(const Compat& ours, const Compat& theirs);

// The value of `name`, or nullptr.
const std::string* compat_value(const Compat& c, const std::string& name);

// Empty when `c` is within the bounds above (names non-empty and distinct), else why not.
std::string compat_bounds_error(const Compat& c);

}  // namespace kvferry
