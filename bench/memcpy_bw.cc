// Single-thread memcpy bandwidth with kvferry's access pattern, the reference of bench/compare.sh:
// a source buffer the size of the prefill pool, a destination the size of the decode pool (both
// touched first, so no page fault is timed), `write` bytes per memcpy, cycling through both buffers
// (cache-cold like KV pages), `volume` bytes in all, repeated `reps` times; prints the best and
// median repetition as JSON. GB = 10^9 bytes.
//   memcpy_bw SRC_BYTES DST_BYTES WRITE_BYTES VOLUME_BYTES [REPS]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: memcpy_bw SRC_BYTES DST_BYTES WRITE_BYTES VOLUME_BYTES [REPS]\n");
    return 2;
  }
  const uint64_t src_bytes = std::strtoull(argv[1], nullptr, 10), dst_bytes = std::strtoull(argv[2], nullptr, 10);
  const uint64_t write = std::strtoull(argv[3], nullptr, 10), volume = std::strtoull(argv[4], nullptr, 10);
  const int reps = argc > 5 ? std::atoi(argv[5]) : 3;
  if (write == 0 || write > src_bytes || write > dst_bytes || volume < write || reps < 1) {
    std::fprintf(stderr, "memcpy_bw: need 0 < WRITE <= SRC, DST and VOLUME >= WRITE\n");
    return 2;
  }
  std::vector<char> src(src_bytes), dst(dst_bytes);
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 2, dst.size());
  const uint64_t src_slots = src_bytes / write, dst_slots = dst_bytes / write;
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    uint64_t s = 0, d = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t done = 0; done < volume; done += write) {
      std::memcpy(dst.data() + d * write, src.data() + s * write, write);
      s = s + 1 == src_slots ? 0 : s + 1;
      d = d + 1 == dst_slots ? 0 : d + 1;
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gbps.push_back(static_cast<double>(volume) / 1e9 / sec);
  }
  std::sort(gbps.begin(), gbps.end());
  std::printf("{\"write_bytes\": %llu, \"volume_bytes\": %llu, \"src_bytes\": %llu, \"dst_bytes\": %llu, "
              "\"best_gb_per_s\": %.4f, \"median_gb_per_s\": %.4f, \"check\": %d}\n",
              static_cast<unsigned long long>(write), static_cast<unsigned long long>(volume),
              static_cast<unsigned long long>(src_bytes), static_cast<unsigned long long>(dst_bytes), gbps.back(),
              gbps[gbps.size() / 2], dst[dst_bytes - 1]);
  return 0;
}
