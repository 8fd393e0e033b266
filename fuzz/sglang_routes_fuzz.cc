// The SGLang-shaped bootstrap routes (src/bootstrap/sglang_routes.cc) on a fresh registry per
// input: the input is lines, each a request "<op> <body>" with op P (PUT /route), G (GET /route,
// body "dp cp tp pp" query values; "-" for an absent one), R (POST /register_dp_rank) or
// Q (POST /query_dp_ranks); bodies are parsed as the server parses them (no exceptions). Every
// answer is 200, 400, 404 or 503, never a crash or an exception.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bootstrap/sglang_routes.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvferry::bootstrap::SglangRegistry reg;
  std::string input(reinterpret_cast<const char*>(data), size);
  std::istringstream lines(input);
  std::string line;
  int64_t now_ns = 1;
  for (int n = 0; n < 64 && std::getline(lines, line); ++n) {
    if (line.size() < 2) continue;
    const char op = line[0];
    const std::string body = line.substr(2);
    kvferry::bootstrap::Reply reply;
    if (op == 'G') {
      std::istringstream q(body);
      std::vector<std::string> v(4);
      for (auto& s : v) q >> s;
      auto arg = [](const std::string& s) { return s == "-" ? nullptr : &s; };
      reply = reg.get_route(arg(v[0]), arg(v[1]), arg(v[2]), arg(v[3]));
    } else {
      auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) continue;  // the server answers 400 before any route sees it
      if (op == 'P') reply = reg.put_route(j);
      else if (op == 'R') reply = reg.register_dp_rank(j, now_ns);
      else if (op == 'Q') reply = reg.query_dp_ranks(j, now_ns);
      else continue;
      now_ns += 1'000'000'000;
    }
    FUZZ_CHECK(reply.status == 200 || reply.status == 400 || reply.status == 404 || reply.status == 503);
  }
  return 0;
}
