// The memcpy reference of bench/compare.sh (docs/BENCHMARKS.md): the same pieces kvferry moves,
// copied by plain memcpy with the same number of threads, between two buffers the size of the
// prefill and the decode pool. Both buffers are shared memory, pre-faulted and locked as kvferry's
// pools are (core/residency.h), so no page fault is timed on either side.
//
//   memcpy_bw --src-bytes N --dst-bytes N --piece N --volume N [--reps 3] [--threads 1]
//             [--order sequential|random] [--buffers 1] [--room-pages 1] [--seed 1]
//
// Layout, as kvferry's pools: `buffers` KV buffers (one per layer tensor) side by side, each cut
// into pages of `piece` bytes. A room is `room-pages` pages of every buffer; rooms take the pages of
// the pool in turn (cycling: cache-cold, as KV pages are), and its pieces are copied buffer by
// buffer, page by page (kvferry's write order). `sequential`: room page q goes from source page q to
// destination page q of the room's range; `random`: both sides' page orders are fixed random
// permutations within the room (kvferry bench --page-order random). Threads take whole rooms in
// turn (room k to thread k % threads, as kvferry's transfer shards take rooms), all started
// together; the time is until the last is done. `volume` bytes are copied per repetition (whole
// rooms). Prints the best and median repetition as JSON. GB = 10^9 bytes.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/residency.h"

namespace {

uint8_t* map_buffer(uint64_t bytes, uint8_t fill) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)kvferry::make_resident(p, bytes, true, kvferry::ResidencyOptions{});
  std::memset(p, fill, bytes);
  return static_cast<uint8_t*>(p);
}

std::vector<uint64_t> page_order(uint64_t slots, bool random, uint64_t seed) {
  std::vector<uint64_t> v(slots);
  std::iota(v.begin(), v.end(), 0);
  if (random) {
    std::mt19937_64 rng(seed);
    std::shuffle(v.begin(), v.end(), rng);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a = {{"--reps", "3"}, {"--threads", "1"}, {"--order", "sequential"},
                                          {"--seed", "1"}, {"--buffers", "1"}, {"--room-pages", "1"}};
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  auto num = [&](const char* k) { return a.count(k) ? std::strtoull(a[k].c_str(), nullptr, 10) : 0ull; };
  const uint64_t src_bytes = num("--src-bytes"), dst_bytes = num("--dst-bytes"), piece = num("--piece"),
                 volume = num("--volume"), reps = num("--reps"), threads = num("--threads");
  const bool random = a["--order"] == "random";
  if (piece == 0 || piece > src_bytes || piece > dst_bytes || volume < piece || reps < 1 || threads < 1 ||
      threads > 64 || num("--buffers") < 1 || num("--room-pages") < 1 || (!random && a["--order"] != "sequential")) {
    std::fprintf(stderr,
                 "usage: memcpy_bw --src-bytes N --dst-bytes N --piece N --volume N [--reps 3] [--threads 1] "
                 "[--order sequential|random] [--buffers 1] [--room-pages 1] [--seed 1]\n(0 < piece <= both buffers, volume >= "
                 "piece)\n");
    return 2;
  }
  uint8_t* src = map_buffer(src_bytes, 1);
  uint8_t* dst = map_buffer(dst_bytes, 2);
  if (src == nullptr || dst == nullptr) {
    std::fprintf(stderr, "memcpy_bw: cannot map the buffers\n");
    return 1;
  }
  const uint64_t seed = num("--seed"), buffers = num("--buffers"), room_pages = num("--room-pages");
  const uint64_t src_pages = src_bytes / buffers / piece, dst_pages = dst_bytes / buffers / piece;
  if (room_pages > src_pages || room_pages > dst_pages) {
    std::fprintf(stderr, "memcpy_bw: a room of %llu pages does not fit %llu buffers of the pools\n",
                 static_cast<unsigned long long>(room_pages), static_cast<unsigned long long>(buffers));
    return 2;
  }
  const std::vector<uint64_t> src_order = page_order(room_pages, random, seed);
  const std::vector<uint64_t> dst_order = page_order(room_pages, random, seed + 1);
  const uint64_t room_bytes = room_pages * buffers * piece;
  // Whole rooms, as many per thread (an uneven share would time one thread alone at the end).
  const uint64_t rooms = std::max<uint64_t>(1, volume / room_bytes / threads) * threads;
  // Rooms take consecutive page ranges of each side's pool, wrapping where a room no longer fits.
  const uint64_t src_rooms = src_pages / room_pages, dst_rooms = dst_pages / room_pages;
  std::vector<double> gbps;
  for (uint64_t r = 0; r < reps; ++r) {
    std::atomic<uint64_t> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (uint64_t t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        ready++;
        while (!go.load(std::memory_order_acquire)) {
        }
        for (uint64_t k = t; k < rooms; k += threads) {
          const uint64_t s0 = (k % src_rooms) * room_pages, d0 = (k % dst_rooms) * room_pages;
          for (uint64_t b = 0; b < buffers; ++b) {
            uint8_t* const sb = src + b * src_pages * piece;
            uint8_t* const db = dst + b * dst_pages * piece;
            for (uint64_t q = 0; q < room_pages; ++q)
              std::memcpy(db + (d0 + dst_order[q]) * piece, sb + (s0 + src_order[q]) * piece, piece);
          }
        }
      });
    }
    while (ready.load() < threads) std::this_thread::yield();
    const auto t0 = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gbps.push_back(static_cast<double>(rooms * room_bytes) / 1e9 / sec);
  }
  const uint64_t pieces = rooms * room_pages * buffers;
  std::sort(gbps.begin(), gbps.end());
  std::printf("{\"piece_bytes\": %llu, \"write_bytes\": %llu, \"volume_bytes\": %llu, \"src_bytes\": %llu, "
              "\"dst_bytes\": %llu, \"threads\": %llu, \"order\": \"%s\", \"buffers\": %llu, \"room_pages\": %llu, "
              "\"best_gb_per_s\": %.4f, "
              "\"median_gb_per_s\": %.4f, \"pieces_per_s\": %.0f, \"check\": %d}\n",
              static_cast<unsigned long long>(piece), static_cast<unsigned long long>(piece),
              static_cast<unsigned long long>(pieces * piece), static_cast<unsigned long long>(src_bytes),
              static_cast<unsigned long long>(dst_bytes), static_cast<unsigned long long>(threads),
              random ? "random" : "sequential", static_cast<unsigned long long>(buffers),
              static_cast<unsigned long long>(room_pages), gbps.back(), gbps[gbps.size() / 2],
              gbps[gbps.size() / 2] * 1e9 / static_cast<double>(piece), dst[dst_bytes - 1]);
  return 0;
}
