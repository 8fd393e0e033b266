// The one JSON codec of the failure record (kvferry/error.h Failure), used by every JSON frame,
// result and log line that carries a failure. The record is written as flat fields of the
// enclosing object, so a frame reads {"room":"..", "code":"transfer_error", "origin":"prefill/tp1",
// "reason":"..", "first_seen_ns":N, "wall_ns":N, ...}:
//   code           code_name() (snake_case); never "ok"
//   origin         RankId::str()
//   reason         free text (peer bytes: at most kMaxFailureReasonBytes are kept on decode)
//   first_seen_ns  CLOCK_MONOTONIC ns on the origin's host, >= 0
//   wall_ns        CLOCK_REALTIME ns on the origin, >= 0 (0: unknown); optional on decode
// Decoding never throws: a missing field, a field of the wrong type, an unknown code, an origin
// that is not a RankId or a negative time is kProtocolError naming the field (prefixed by `what`).
// Thread contract: pure functions.
#pragma once
#include <nlohmann/json.hpp>
#include <string_view>

#include "kvferry/error.h"

namespace kvferry {

constexpr size_t kMaxFailureReasonBytes = 1u << 16;

// Adds the record's fields to the object `j` (which must be an object or null).
void put_failure(nlohmann::json& j, const Failure& f);
void put_failure(nlohmann::ordered_json& j, const Failure& f);
// Reads the record's fields from the object `j`.
Result<Failure> get_failure(const nlohmann::json& j, std::string_view what = "failure");

}  // namespace kvferry
