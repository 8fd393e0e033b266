#include "driver/job_worker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace kvferry {
namespace {

void drain_until(JobWorker& w, size_t want, size_t* done) {
  for (int i = 0; i < 2000 && *done < want; ++i) {
    *done += w.drain();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// docs/design.md §4 defect 6: a worker that dies on an exception silently hangs its queue. Here the
// throwing job's error reaches the main thread and the next job still runs.
TEST(JobWorker, Defect6_ExceptionFailsTheJobNotTheWorker) {
  JobWorker w;
  std::string error;
  int ran = 0;
  w.submit([]() -> JobWorker::Completion { throw std::runtime_error("boom"); },
           [&](const std::string& what) { error = what; });
  w.submit([&]() -> JobWorker::Completion { return [&] { ++ran; }; }, nullptr);
  size_t done = 0;
  drain_until(w, 2, &done);
  EXPECT_EQ(done, 2u);
  EXPECT_EQ(error, "boom");
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(w.pending(), 0u);
}

}  // namespace
}  // namespace kvferry
