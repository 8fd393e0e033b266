// Bootstrap JSON (src/bootstrap/rank_info_json.cc), as the bootstrap server and client parse a
// body: nlohmann::json::parse without exceptions, then rank_info_from_json. An accepted entry
// round-trips through rank_info_to_json and dump().
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "bootstrap/rank_info_json.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string body(reinterpret_cast<const char*>(data), size);
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  (void)kvferry::bootstrap::dump(j);
  auto info = kvferry::bootstrap::rank_info_from_json(j);
  if (!info.ok()) return 0;
  auto text = kvferry::bootstrap::dump(kvferry::bootstrap::rank_info_to_json(*info));
  auto j2 = nlohmann::json::parse(text, nullptr, false);
  FUZZ_CHECK(!j2.is_discarded());
  auto info2 = kvferry::bootstrap::rank_info_from_json(j2);
  FUZZ_CHECK(info2.ok());
  FUZZ_CHECK(kvferry::bootstrap::dump(kvferry::bootstrap::rank_info_to_json(*info2)) == text);
  return 0;
}
