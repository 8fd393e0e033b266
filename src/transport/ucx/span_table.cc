// Span tables: the messages of SpanTable and the check of a peer's announced spans.
#include "transport/ucx/span_table.h"

namespace kvferry::ucx {

std::string SpanTable::describe() const {
  if (spans_.size() == 1) {
    return "1 span of " + std::to_string(spans_[0].bytes) + " bytes at offset " +
           std::to_string(spans_[0].offset);
  }
  return std::to_string(spans_.size()) + " spans";
}

Status check_remote_info(const RemoteRegionInfo& info, bool need_rkeys, std::vector<size_t>* order) {
  if (info.worker_address.empty() || info.worker_address.size() > kMaxWorkerAddressBytes) {
    return {ErrorCode::kProtocolError,
            "peer worker address of " + std::to_string(info.worker_address.size()) +
                " bytes (1.." + std::to_string(kMaxWorkerAddressBytes) + " allowed)"};
  }
  Status st = check_spans(info.spans, kMaxTransportSpans, ErrorCode::kProtocolError,
                          "peer spans", order);
  if (!st.ok()) return st;
  for (size_t i = 0; i < info.spans.size(); ++i) {
    const RemoteSpan& s = info.spans[i];
    if (s.base == 0 || s.base > UINT64_MAX - s.bytes) {
      return {ErrorCode::kProtocolError, "peer span " + std::to_string(i) + ": base " +
                                             std::to_string(s.base) + " + " +
                                             std::to_string(s.bytes) + " bytes is not an address range"};
    }
    if (need_rkeys && (s.packed_rkey.empty() || s.packed_rkey.size() > kMaxPackedRkeyBytes)) {
      return {ErrorCode::kProtocolError,
              "peer span " + std::to_string(i) + ": remote key of " +
                  std::to_string(s.packed_rkey.size()) + " bytes (1.." +
                  std::to_string(kMaxPackedRkeyBytes) + " allowed)"};
    }
  }
  return Status::Ok();
}

}  // namespace kvferry::ucx
